// Faults and bad input: every rank fails with a clear message within its
// deadline, and no process hangs (run_ranks kills what is left at its own
// deadline and reports -1, which fails the test).
#include <doctest/doctest.h>

#include "ranks.hpp"

#include <trace_ring.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>

using namespace ballast::comm;

namespace {

constexpr int64_t kTimeoutMs = 1500;

// A communicator whose operations time out after timeout_ms and whose start
// may take up to 15 s (ASan, a loaded machine): the faults here are in the
// operations or in who joins, not in a slow start. A failing start still
// ends at once.
ballast_comm_config config(int rank, int n, int port, int64_t timeout_ms) {
  ballast_comm_config c = test::config(rank, n, port, timeout_ms);
  c.init_timeout_ns = int64_t(15000) * 1000000;
  return c;
}

// Waits, bounded, until the ranks in `ranks` have written their failure:
// a rank that must stay alive until the others gave up on it.
void await_failed(const std::vector<int>& ranks) {
  for (int i = 0; i < 1500; ++i) {
    bool all = true;
    for (int r : ranks) all = all && std::filesystem::exists(test::err_path(r));
    if (all) return;
    usleep(10000);
  }
}

// Written by a rank of loop() once its communicator is up.
std::string ready_path(int rank) { return test::kTraceDir + "/ready-" + std::to_string(rank); }

// Waits, bounded, until every rank of loop() is up: a fault meant for the
// middle of the collectives must not land in a slow start (ASan, load).
bool all_up(int n) {
  for (int i = 0; i < 3000; ++i) {
    bool up = true;
    for (int r = 0; r < n; ++r) up = up && std::filesystem::exists(ready_path(r));
    if (up) return true;
    usleep(10000);
  }
  return false;
}

// Loops allreduces of `count` floats; `fault(rank, iter, &args)` may change
// or skip one (returning false skips it).
int loop(int rank, int n, int port, uint64_t count, int iters,
         const std::function<bool(int, int, ballast_comm_args&)>& fault) {
  ballast_comm_config cfg = config(rank, n, port, kTimeoutMs);
  Comm* comm = nullptr;
  if (int rc = comm_init(&cfg, &comm); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  std::ofstream(ready_path(rank)) << "up\n";
  std::vector<float> in(count + 1, 1.0f), out(count + 1);
  for (int it = 0; it < iters; ++it) {
    ballast_comm_args a{};
    a.size = sizeof a;
    a.op = BALLAST_OP_ALLREDUCE;
    a.dtype = BALLAST_DT_F32;
    a.sendbuf = in.data();
    a.recvbuf = out.data();
    a.count = count;
    if (fault && !fault(rank, it, a)) continue;
    if (int rc = comm_run(comm, &a); rc != BALLAST_OK) {
      const std::string m = last_error();
      comm_destroy(comm);
      return test::child_fail(rank, rc, m);
    }
  }
  comm_destroy(comm);
  return 0;
}

// Every rank in `failing` exited with a failure whose message contains `words`.
void expect_failed(const test::Result& res, const std::vector<int>& failing, const std::string& words) {
  for (int r : failing) {
    const std::string err = test::read_err(r);
    INFO("rank " << r << " exit " << res.codes[size_t(r)] << ": " << err);
    CHECK(res.codes[size_t(r)] >= 10);
    CHECK(res.codes[size_t(r)] < 30);
    CHECK(err.find(words) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("a rank killed in the middle of large allreduces: the others fail naming it") {
  for (const char* tls : {"sm,self", "tcp"}) {
    const int port = test::reserve_ports(1);
    const auto res = test::run_ranks(
        3, tls, 20, [&](int r) { return loop(r, 3, port, 1 << 20, 100000, nullptr); },
        [](std::vector<pid_t>& pids) {
          all_up(3);
          usleep(300000);
          kill(pids[1], SIGKILL);
        });
    INFO("tls " << std::string(tls));
    CHECK(res.codes[1] == 128 + SIGKILL);
    // UCX 1.13 sometimes aborts a survivor itself (over sm: mapping the dead
    // peer's segment fails fatally without peer error handling, which sm
    // lacks; rarely over tcp too): that rank ends, it never hangs. At least
    // one survivor must end with our error naming the dead rank.
    std::vector<int> clean;
    for (int r : {0, 2})
      if (res.codes[size_t(r)] != 128 + SIGABRT) clean.push_back(r);
    CHECK(!clean.empty());
    expect_failed(res, clean, "rank 1");
  }
}

TEST_CASE("a send started to a rank that died: the start's failure is the operation's result, naming the rank") {
  // Rank 1 leaves at once; rank 0 keeps its worker running in a receive
  // from rank 2 (which sends late) until the connection to rank 1 has
  // failed, then starts a send to rank 1.
  const int port = test::reserve_ports(1);
  const auto res = test::run_ranks(3, "tcp", 60, [&](int rank) {
    ballast_comm_config cfg = config(rank, 3, port, 5000);
    Comm* c = nullptr;
    if (int rc = comm_init(&cfg, &c); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    std::vector<float> buf(16, 1);
    ballast_comm_args a{};
    a.size = sizeof a;
    a.op = BALLAST_OP_ALLREDUCE;
    a.dtype = BALLAST_DT_F32;
    a.sendbuf = a.recvbuf = buf.data();
    a.count = buf.size();
    if (int rc = comm_run(c, &a); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    if (rank == 1) _exit(0);
    if (rank == 2) {
      sleep(2);
      a.op = BALLAST_OP_SEND;
      a.root = 0;
      comm_run(c, &a);  // its outcome depends on how far rank 0 got: not checked
      comm_destroy(c);
      return 0;
    }
    a.op = BALLAST_OP_RECV;
    a.root = 2;
    ballast_comm_request *recv = nullptr, *send = nullptr;
    if (int rc = comm_start(c, &a, &recv); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    int done = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
    while (std::chrono::steady_clock::now() < until && !done) comm_test(recv, &done);
    if (done)
      return test::child_fail(rank, BALLAST_EIO, "the receive from rank 2 ended early: " + std::string(last_error()));
    a.op = BALLAST_OP_SEND;
    a.root = 1;
    if (int rc = comm_start(c, &a, &send); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    const int rc = comm_wait(send);
    const std::string msg = last_error();
    if (rc != BALLAST_EPEER || msg.find("rank 1") == std::string::npos)
      return test::child_fail(rank, BALLAST_EIO, "send: " + std::to_string(rc) + " " + msg);
    if (comm_wait(recv) != BALLAST_EPEER) return test::child_fail(rank, BALLAST_EIO, "the receive did not end with it");
    // Its record: written, and failed.
    TraceRing* ring = TraceRing::current();
    int failed_sends = 0;
    for (uint64_t i = 0; i < ring->head(); ++i) {
      ballast_trace_slot s;
      if (ring->read(i, &s) && s.op == BALLAST_OP_SEND && s.peer == 1 && s.state == BALLAST_TRACE_FAILED &&
          s.status == BALLAST_EPEER && s.end_tick >= s.start_tick)
        ++failed_sends;
    }
    if (failed_sends != 1) return test::child_fail(rank, BALLAST_EIO, "no failed record of the send");
    comm_destroy(c);
    return 0;
  });
  INFO("rank 0: ", test::read_err(0));
  CHECK(res.codes[0] == 0);
  CHECK(res.codes[2] != -1);
}

TEST_CASE("a stopped rank (SIGSTOP): the others time out naming it as stopped") {
  for (const char* tls : {"sm,self", "tcp"}) {
    INFO("tls " << std::string(tls));
    const int port = test::reserve_ports(1);
    const auto res = test::run_ranks(
        3, tls, 20,
        [&](int r) {
          return loop(r, 3, port, 1000, 50, [](int rank, int it, ballast_comm_args&) {
            if (rank == 2 && it == 20) raise(SIGSTOP);
            return true;
          });
        },
        [](std::vector<pid_t>& pids) {
          // Release the stopped rank once both others are done (not before:
          // a survivor still waiting would see it die instead of stopped), so
          // that it can be reaped.
          siginfo_t info;
          for (int i = 0; i < 2000; ++i) {
            bool done = true;
            for (int r : {0, 1}) {
              info.si_pid = 0;
              done = done &&
                     waitid(P_PID, static_cast<id_t>(pids[size_t(r)]), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                     info.si_pid != 0;
            }
            if (done) break;
            usleep(10000);
          }
          kill(pids[2], SIGKILL);
        });
    // Each survivor names the rank it waited for; the one waiting on rank 2 says it is stopped.
    expect_failed(res, {0, 1}, "timed out");
    CHECK((test::read_err(0) + test::read_err(1)).find("rank 2 (pid") != std::string::npos);
    CHECK((test::read_err(0) + test::read_err(1)).find("stopped") != std::string::npos);
  }
}

TEST_CASE("a rank that skips a collective: the others time out waiting for it") {
  for (const char* tls : {"sm,self", "tcp"}) {
    INFO("tls " << std::string(tls));
    const int port = test::reserve_ports(1);
    const auto res = test::run_ranks(3, tls, 20, [&](int r) {
      const int rc =
          loop(r, 3, port, 16, 10, [](int rank, int it, ballast_comm_args&) { return !(rank == 0 && it == 9); });
      if (r == 0) await_failed({1, 2});  // alive, but never joins
      return rc;
    });
    CHECK(res.codes[0] == 0);
    expect_failed(res, {1, 2}, "rank 0");
  }
}

// The non-blocking calls, as a trainer overlapping compute would use them:
// start, then test until done. The operation's own deadline (300 ms) wins
// over the communicator's (20 s): the waiting ranks fail well before it.
TEST_CASE("start, test and wait with a per-operation deadline: a silent peer fails the operation within it") {
  for (const char* tls : {"sm,self", "tcp"}) {
    INFO("tls " << std::string(tls));
    const int port = test::reserve_ports(1);
    const auto res = test::run_ranks(3, tls, 20, [&](int r) {
      ballast_comm_config cfg = config(r, 3, port, 20000);
      Comm* comm = nullptr;
      if (int rc = comm_init(&cfg, &comm); rc != BALLAST_OK) return test::child_fail(r, rc, last_error());
      if (r == 0) {  // alive, never joins
        await_failed({1, 2});
        comm_destroy(comm);
        return 0;
      }
      std::vector<float> in(4096, 1.0f), out(4096);
      ballast_comm_args a{};
      a.size = sizeof a;
      a.op = BALLAST_OP_ALLREDUCE;
      a.dtype = BALLAST_DT_F32;
      a.sendbuf = in.data();
      a.recvbuf = out.data();
      a.count = in.size();
      a.timeout_ns = 300000000;
      const auto t0 = std::chrono::steady_clock::now();
      ballast_comm_request* req = nullptr;
      if (int rc = comm_start(comm, &a, &req); rc != BALLAST_OK) return test::child_fail(r, rc, last_error());
      int done = 0, polls = 0, rc = BALLAST_OK;
      while (!done) {  // test reports the outcome once done; the request is then no longer ours
        rc = comm_test(req, &done);
        ++polls;
        usleep(1000);  // the trainer's compute between polls
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::string m = last_error();
      comm_destroy(comm);
      if (rc == BALLAST_OK) return test::child_fail(r, BALLAST_EINTERNAL, "the allreduce succeeded without rank 0");
      if (s > 5.0 || polls < 2) {
        m = "failed after " + std::to_string(s) + " s and " + std::to_string(polls) +
            " polls, not within its 300 ms deadline: " + m;
        return test::child_fail(r, BALLAST_EINTERNAL, m);
      }
      return test::child_fail(r, rc, m);
    });
    CHECK(res.codes[0] == 0);
    expect_failed(res, {1, 2}, "timed out");
    CHECK(test::read_err(1).find("rank 0") != std::string::npos);
  }
}

TEST_CASE("two ranks in a different collective: every rank reports the mismatch") {
  for (const char* tls : {"sm,self", "tcp"}) {
    INFO("tls " << std::string(tls));
    const int port = test::reserve_ports(1);
    const auto res = test::run_ranks(4, tls, 20, [&](int r) {
      return loop(r, 4, port, 64, 5, [](int rank, int it, ballast_comm_args& a) {
        if (it == 3 && rank >= 2) a.op = BALLAST_OP_BROADCAST;
        return true;
      });
    });
    expect_failed(res, {0, 1, 2, 3}, "mismatched");
  }
}

TEST_CASE("a rank that finds a mismatch tells the others: they fail with its notice") {
  // Rank 1 calls a broadcast from rank 0 while ranks 0 and 2 call an
  // allreduce: rank 1 sees rank 0's allreduce message, and the others see
  // nothing wrong until its notice comes.
  for (const char* tls : {"sm,self", "tcp"}) {
    INFO("tls " << std::string(tls));
    const int port = test::reserve_ports(1);
    const auto res = test::run_ranks(3, tls, 20, [&](int r) {
      return loop(r, 3, port, 1024, 5, [](int rank, int it, ballast_comm_args& a) {
        if (it == 3 && rank == 1) a.op = BALLAST_OP_BROADCAST;
        return true;
      });
    });
    expect_failed(res, {1}, "mismatched collectives");
    expect_failed(res, {0, 2}, "rank 1 reported a failure: mismatched collectives");
  }
}

TEST_CASE("mismatched dtypes and counts across ranks: a clear error on every rank") {
  for (int variant = 0; variant < 2; ++variant) {
    const int port = test::reserve_ports(1);
    const auto res = test::run_ranks(3, variant ? "tcp" : "sm,self", 20, [&](int r) {
      return loop(r, 3, port, 100000, 3, [variant](int rank, int, ballast_comm_args& a) {
        if (rank == 1) {
          if (variant == 0)
            a.dtype = BALLAST_DT_I32;
          else
            a.count += 1;
        }
        return true;
      });
    });
    INFO("variant " << variant);
    expect_failed(res, {0, 1, 2}, "mismatched");
  }
}

TEST_CASE("a wrong world size fails on every rank") {
  const int port = test::reserve_ports(1);
  const auto res = test::run_ranks(2, "sm,self", 20, [&](int r) {
    ballast_comm_config cfg = config(r, r == 1 ? 3 : 2, port, kTimeoutMs);
    Comm* comm = nullptr;
    const int rc = comm_init(&cfg, &comm);
    comm_destroy(comm);
    return rc == BALLAST_OK ? 0 : test::child_fail(r, rc, last_error());
  });
  expect_failed(res, {0, 1}, "world size mismatch");
}

// A world of 3 whose rank 2 never comes: rank 0 is still gathering when the
// second claimant of rank 1 arrives, however late.
TEST_CASE("a rank that joins twice fails every rank") {
  const int port = test::reserve_ports(1);
  const auto res = test::run_ranks(3, "sm,self", 20, [&](int r) {
    const int rank = r == 2 ? 1 : r;
    ballast_comm_config cfg = config(rank, 3, port, kTimeoutMs);
    Comm* comm = nullptr;
    const int rc = comm_init(&cfg, &comm);
    comm_destroy(comm);
    return rc == BALLAST_OK ? 0 : test::child_fail(r, rc, last_error());
  });
  // Rank 0 and the two claimants of rank 1 all fail; both sides name the duplicate.
  expect_failed(res, {0, 1, 2}, "joined twice");
}

TEST_CASE("an unreachable master, and a port in use, fail within the deadline") {
  const int port = test::reserve_ports(1);  // nobody listens there
  ballast_comm_config cfg = test::config(1, 2, port, 800);
  Comm* comm = nullptr;
  CHECK(comm_init(&cfg, &comm) == BALLAST_ETIMEDOUT);
  CHECK(std::string(last_error()).find("cannot reach the master") != std::string::npos);

  // A port held by another program: rank 0 cannot listen, rank 1 gets no answer.
  const int busy = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(busy, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  listen(busy, 16);
  socklen_t len = sizeof sa;
  getsockname(busy, reinterpret_cast<sockaddr*>(&sa), &len);
  const int held = ntohs(sa.sin_port);
  const auto res = test::run_ranks(2, "sm,self", 20, [&](int r) {
    ballast_comm_config c = test::config(r, 2, held, 1000);
    Comm* cm = nullptr;
    const int rc = comm_init(&c, &cm);
    comm_destroy(cm);
    return rc == BALLAST_OK ? 0 : test::child_fail(r, rc, last_error());
  });
  close(busy);
  expect_failed(res, {0}, "in use");
  expect_failed(res, {1}, "no answer from the master");
}

TEST_CASE("abort from another thread ends a wait at once") {
  // A world of one waits on nothing; a two-rank world whose peer never comes
  // would block in init, so the abort is tested on a send to a silent peer.
  const int port = test::reserve_ports(1);
  const auto res = test::run_ranks(2, "sm,self", 20, [&](int r) {
    ballast_comm_config cfg = config(r, 2, port, 10000);
    Comm* comm = nullptr;
    if (int rc = comm_init(&cfg, &comm); rc != BALLAST_OK) return test::child_fail(r, rc, last_error());
    if (r == 1) {
      await_failed({0});
      comm_destroy(comm);
      return 0;
    }
    int32_t v = 0;
    ballast_comm_args a{};
    a.size = sizeof a;
    a.op = BALLAST_OP_RECV;
    a.dtype = BALLAST_DT_I32;
    a.recvbuf = &v;
    a.count = 1;
    a.root = 1;
    std::thread t([comm] {
      usleep(200000);
      comm_abort(comm, "test abort");
    });
    const int rc = comm_run(comm, &a);
    t.join();
    const std::string m = last_error();
    comm_destroy(comm);
    return test::child_fail(r, rc, m);
  });
  expect_failed(res, {0}, "test abort");
  CHECK(res.codes[0] == test::fail_code(BALLAST_EABORTED));
}
