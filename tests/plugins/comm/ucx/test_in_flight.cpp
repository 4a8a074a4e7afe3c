// Several operations of one communicator in flight at once, as a trainer
// overlapping its gradient buckets does: collectives run in start order
// (queued behind the running one), sends and receives beside them; real
// processes over shared memory and tcp.
#include <doctest/doctest.h>

#include "ranks.hpp"

#include <trace_ring.hpp>

#include <poll.h>

#include <cstddef>
#include <cstring>
#include <vector>

using namespace ballast::comm;

namespace {

// Allreduces of sizes that take every algorithm (one exchange, recursive
// doubling, halving, ring in chunks), a broadcast and an allgather, all
// started before any is waited for, then waited for in reverse order.
int queued_collectives(int rank, int n, int port, bool test_last_first) {
  auto cfg = test::config(rank, n, port, 30000);
  Comm* c = nullptr;
  if (int rc = comm_init(&cfg, &c); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  const std::vector<uint64_t> counts = {2, 200, 5000, 70000, 300001, 1u << 20};
  std::vector<std::vector<float>> in, out;
  std::vector<ballast_comm_request*> reqs;
  for (size_t k = 0; k < counts.size(); ++k) {
    in.emplace_back(counts[k]);
    out.emplace_back(counts[k], -1.0f);
    for (uint64_t i = 0; i < counts[k]; ++i) in[k][i] = float((rank + 1) * (i % 7 + k));
  }
  std::vector<int32_t> bcast(1000, rank == 1 ? 42 : 0);
  std::vector<int32_t> mine(300, rank), all(300 * size_t(n), -1);
  for (size_t k = 0; k < counts.size(); ++k) {
    auto a = test::args_of(BALLAST_OP_ALLREDUCE, in[k].data(), out[k].data(), counts[k]);
    ballast_comm_request* r = nullptr;
    if (int rc = comm_start(c, &a, &r); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    reqs.push_back(r);
    if (k == 2) {  // a broadcast and an allgather among them
      auto b = test::args_of(BALLAST_OP_BROADCAST, nullptr, bcast.data(), bcast.size(), BALLAST_DT_I32);
      b.root = 1;
      auto g = test::args_of(BALLAST_OP_ALLGATHER, mine.data(), all.data(), mine.size(), BALLAST_DT_I32);
      for (auto* x : {&b, &g}) {
        if (int rc = comm_start(c, x, &r); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
        reqs.push_back(r);
      }
    }
  }
  if (test_last_first) {
    // Polling the last one runs all before it: each is then done at its first test.
    int done = 0;
    while (!done)
      if (int rc = comm_test(reqs.back(), &done); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    reqs.pop_back();
    for (auto* r : reqs) {
      const int rc = comm_test(r, &done);
      if (rc != BALLAST_OK || !done)
        return test::child_fail(rank, rc ? rc : BALLAST_ESTATE, "an earlier op was not done");
    }
  } else {
    for (size_t k = reqs.size(); k-- > 0;)
      if (int rc = comm_wait(reqs[k]); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  }
  const float ranks_sum = float(n * (n + 1) / 2);
  for (size_t k = 0; k < counts.size(); ++k)
    for (uint64_t i = 0; i < counts[k]; ++i)
      if (out[k][i] != ranks_sum * float(i % 7 + k))
        return test::child_fail(rank, BALLAST_EIO, "allreduce " + std::to_string(k) + " element " + std::to_string(i));
  for (int32_t v : bcast)
    if (v != 42) return test::child_fail(rank, BALLAST_EIO, "broadcast");
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] != int32_t(i / 300)) return test::child_fail(rank, BALLAST_EIO, "allgather");
  // The records: each queued collective was issued at start, started only
  // after the one before it ended.
  TraceRing* ring = TraceRing::current();
  ballast_comm_info info{};
  info.size = sizeof info;
  comm_info(c, &info);
  uint64_t prev_end = 0;
  int queued = 0;
  for (uint64_t i = 0; i < ring->head(); ++i) {
    ballast_trace_slot s;
    if (!ring->read(i, &s) || s.comm_id != info.comm_id) continue;
    if (s.state != BALLAST_TRACE_DONE || s.start_tick < s.issue_tick || s.end_tick < s.start_tick)
      return test::child_fail(rank, BALLAST_EIO,
                              "record of seq " + std::to_string(s.seq) + " is not done and in order");
    if (s.start_tick > s.issue_tick) ++queued;
    // 5 us: the TSC clock's re-anchoring may step back by about a microsecond.
    if (s.start_tick + 5000 < prev_end)
      return test::child_fail(rank, BALLAST_EIO,
                              "seq " + std::to_string(s.seq) + " started before the one before ended");
    prev_end = s.end_tick;
  }
  if (queued < 4)
    return test::child_fail(rank, BALLAST_EIO, "only " + std::to_string(queued) + " records show a wait in the queue");
  comm_destroy(c);
  return 0;
}

void expect_all_ok(const test::Result& r) {
  for (size_t i = 0; i < r.codes.size(); ++i) CHECK_MESSAGE(r.codes[i] == 0, "rank ", i, ": ", test::read_err(int(i)));
}

}  // namespace

TEST_CASE("collectives started together run in start order and each gives its own result") {
  for (const char* tls : {"sm,self", "tcp"})
    for (int n : {2, 4})
      for (bool last_first : {false, true}) {
        INFO(tls, " ", n, " ranks", last_first ? ", the last one polled first" : ", waited in reverse");
        const int port = test::reserve_ports(1);
        expect_all_ok(
            test::run_ranks(n, tls, 120, [&](int rank) { return queued_collectives(rank, n, port, last_first); }));
      }
}

TEST_CASE("a send and a receive in flight together: both ways at once, beside a collective") {
  // 16 MiB each way goes by rendezvous: run one after the other, each rank's
  // send would wait for a receive the peer has not posted yet.
  for (const char* tls : {"sm,self", "tcp"}) {
    INFO(tls);
    const int port = test::reserve_ports(1);
    const auto r = test::run_ranks(2, tls, 120, [&](int rank) {
      auto cfg = test::config(rank, 2, port, 20000);
      Comm* c = nullptr;
      if (int rc = comm_init(&cfg, &c); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
      const size_t count = 4u << 20;
      std::vector<float> out(count, float(rank + 1)), back(count, 0), sum(1000, 1), summed(1000, 0);
      auto s = test::args_of(BALLAST_OP_SEND, out.data(), nullptr, count);
      auto v = test::args_of(BALLAST_OP_RECV, nullptr, back.data(), count);
      s.root = v.root = 1 - rank;
      auto ar = test::args_of(BALLAST_OP_ALLREDUCE, sum.data(), summed.data(), sum.size());
      ballast_comm_request *rs = nullptr, *rv = nullptr, *ra = nullptr;
      if (int rc = comm_start(c, &s, &rs); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
      if (int rc = comm_start(c, &ar, &ra); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
      if (int rc = comm_start(c, &v, &rv); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
      for (auto* q : {ra, rv, rs})
        if (int rc = comm_wait(q); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
      for (float x : back)
        if (x != float(2 - rank)) return test::child_fail(rank, BALLAST_EIO, "received data");
      for (float x : summed)
        if (x != 2) return test::child_fail(rank, BALLAST_EIO, "allreduce");
      comm_destroy(c);
      return 0;
    });
    expect_all_ok(r);
  }
}

// Rank 0 starts an operation, then computes (blocks on a pipe, never
// calling into the comm) until rank 1 says that its side completed: which it
// can only if rank 0's start already sent its data. queued: rank 0 starts
// it behind another collective, and computes once a test saw that one done
// (its turn came inside that test).
int completes_while_starter_computes(int rank, int port, uint32_t op, int pipe_fd, bool queued = false) {
  auto cfg = test::config(rank, 2, port, 20000);
  Comm* c = nullptr;
  if (int rc = comm_init(&cfg, &c); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  std::vector<float> in(1000, float(rank + 1)), out(1000, 0);
  auto warm = test::args_of(BALLAST_OP_ALLREDUCE, in.data(), out.data(), in.size());  // connections wired up
  if (int rc = comm_run(c, &warm); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  auto a = test::args_of(op, in.data(), out.data(), in.size());
  if (op == BALLAST_OP_SEND || op == BALLAST_OP_RECV) {
    a.op = rank == 0 ? BALLAST_OP_SEND : BALLAST_OP_RECV;
    a.root = 1 - rank;
  }
  std::vector<float> first_in(8, 1), first_out(8);
  auto first = test::args_of(BALLAST_OP_ALLREDUCE, first_in.data(), first_out.data(), first_in.size());
  if (rank == 1) {
    if (queued)
      if (int rc = comm_run(c, &first); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    if (int rc = comm_run(c, &a); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    const char byte = 1;
    if (write(pipe_fd, &byte, 1) != 1) return test::child_fail(rank, BALLAST_EIO, "write to the pipe");
  } else {
    ballast_comm_request *q = nullptr, *q_first = nullptr;
    if (queued)
      if (int rc = comm_start(c, &first, &q_first); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    if (int rc = comm_start(c, &a, &q); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    for (int done = 0; q_first && !done;)
      if (int rc = comm_test(q_first, &done); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    pollfd pfd{pipe_fd, POLLIN, 0};
    if (poll(&pfd, 1, 10000) != 1)
      return test::child_fail(rank, BALLAST_ETIMEDOUT,
                              "rank 1 did not complete in 10 s while rank 0 computed after start");
    if (int rc = comm_wait(q); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  }
  const float want = op == BALLAST_OP_ALLREDUCE ? 3 : 1;
  if (rank == 1 || op == BALLAST_OP_ALLREDUCE)
    for (float x : out)
      if (x != want) return test::child_fail(rank, BALLAST_EIO, "received " + std::to_string(x));
  comm_destroy(c);
  return 0;
}

TEST_CASE("start sends an operation's first messages: a peer completes while the starter computes") {
  for (const char* tls : {"sm,self", "tcp"})
    for (uint32_t op : {uint32_t(BALLAST_OP_ALLREDUCE), uint32_t(BALLAST_OP_SEND)})
      for (bool queued : {false, true}) {
        if (queued && op == BALLAST_OP_SEND) continue;  // sends never queue
        INFO(tls, " ", ballast_op_name(op), queued ? ", queued behind another collective" : "");
        int fds[2];
        REQUIRE(pipe(fds) == 0);
        const int port = test::reserve_ports(1);
        expect_all_ok(test::run_ranks(2, tls, 60, [&](int rank) {
          return completes_while_starter_computes(rank, port, op, rank == 0 ? fds[0] : fds[1], queued);
        }));
        close(fds[0]);
        close(fds[1]);
      }
}

// The record of each finished operation holds its final progress: every
// chunk posted and completed, the bytes each way, the last step, no peer
// waited on.
int final_progress(int rank, int port) {
  auto cfg = test::config(rank, 2, port, 20000);
  Comm* c = nullptr;
  if (int rc = comm_init(&cfg, &c); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  std::vector<float> in(1u << 20, 1), out(1u << 20);
  auto small = test::args_of(BALLAST_OP_ALLREDUCE, in.data(), out.data(), 2);
  auto large = test::args_of(BALLAST_OP_ALLREDUCE, in.data(), out.data(), in.size());
  auto p2p = test::args_of(rank == 0 ? BALLAST_OP_SEND : BALLAST_OP_RECV, in.data(), out.data(), 1000);
  p2p.root = 1 - rank;
  for (auto* a : {&small, &large, &p2p})
    if (int rc = comm_run(c, a); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  TraceRing* ring = TraceRing::current();
  std::vector<ballast_trace_slot> recs;
  for (uint64_t i = 0; i < ring->head(); ++i) {
    ballast_trace_slot s;
    if (ring->read(i, &s)) recs.push_back(s);
  }
  if (recs.size() != 3) return test::child_fail(rank, BALLAST_EIO, std::to_string(recs.size()) + " records");
  for (const auto& s : recs) {
    const std::string what = std::string(ballast_op_name(s.op)) + " of " + std::to_string(s.bytes) + " bytes: ";
    if (s.state != BALLAST_TRACE_DONE || s.status != BALLAST_OK || s.end_tick < s.start_tick)
      return test::child_fail(rank, BALLAST_EIO, what + "not done, or ends before it starts");
    if (s.chunks_total == 0 || s.chunks_posted != s.chunks_total || s.chunks_sent + s.chunks_received != s.chunks_total)
      return test::child_fail(rank, BALLAST_EIO,
                              what + "chunks " + std::to_string(s.chunks_posted) + " posted, " +
                                  std::to_string(s.chunks_sent) + " sent, " + std::to_string(s.chunks_received) +
                                  " received of " + std::to_string(s.chunks_total));
    if (s.step != s.steps || s.steps == 0 || s.wait_peer != -1 || s.send_peer != -1)
      return test::child_fail(rank, BALLAST_EIO,
                              what + "step " + std::to_string(s.step) + " of " + std::to_string(s.steps) +
                                  ", waiting for " + std::to_string(s.wait_peer) + ", sending to " +
                                  std::to_string(s.send_peer));
  }
  // 2 floats: one exchange, 8 bytes each way, reduced once.
  if (recs[0].bytes_sent != 8 || recs[0].bytes_received != 8 || recs[0].chunks_reduced != 1)
    return test::child_fail(rank, BALLAST_EIO,
                            "the 8-byte allreduce: " + std::to_string(recs[0].bytes_sent) + " bytes sent, " +
                                std::to_string(recs[0].bytes_received) + " received, " +
                                std::to_string(recs[0].chunks_reduced) + " chunks reduced");
  // 4 MiB: half reduced and half gathered each way, at least.
  if (recs[1].bytes_sent < (4u << 20) / 2 || recs[1].bytes_received != recs[1].bytes_sent ||
      recs[1].chunks_reduced == 0)
    return test::child_fail(rank, BALLAST_EIO,
                            "the 4 MiB allreduce sent " + std::to_string(recs[1].bytes_sent) + " and received " +
                                std::to_string(recs[1].bytes_received));
  const uint64_t sent = rank == 0 ? 4000 : 0;
  if (recs[2].bytes_sent != sent || recs[2].bytes_received != 4000 - sent)
    return test::child_fail(rank, BALLAST_EIO, "the send/receive's bytes");
  comm_destroy(c);
  return 0;
}

TEST_CASE("a finished operation's record holds its final progress") {
  for (const char* tls : {"sm,self", "tcp"}) {
    INFO(tls);
    const int port = test::reserve_ports(1);
    expect_all_ok(test::run_ranks(2, tls, 60, [&](int rank) { return final_progress(rank, port); }));
  }
}

// Requests are pooled and keep their plan (and the record made for it) for
// the same arguments: more distinct operations than the pool keeps, twice
// over, so that requests are reused for other arguments; each record must
// still describe its own operation.
int records_of_reused_requests(int rank, int port) {
  auto cfg = test::config(rank, 2, port, 20000);
  Comm* c = nullptr;
  if (int rc = comm_init(&cfg, &c); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  std::vector<float> in(64, 1), out(64);
  std::vector<ballast_comm_args> ops;
  for (uint64_t count = 1; count <= 24; ++count) {
    ops.push_back(test::args_of(count % 3 ? BALLAST_OP_ALLREDUCE : BALLAST_OP_BROADCAST, in.data(), out.data(), count));
    ops.back().root = int32_t(count % 2);
  }
  TraceRing* ring = TraceRing::current();
  const uint64_t first = ring->head();
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& a : ops)
      if (int rc = comm_run(c, &a); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  if (ring->head() - first != 2 * ops.size()) return test::child_fail(rank, BALLAST_EIO, "records missing");
  for (uint64_t i = 0; i < 2 * ops.size(); ++i) {
    const ballast_comm_args& a = ops[i % ops.size()];
    ballast_trace_slot s;
    if (!ring->read(first + i, &s)) return test::child_fail(rank, BALLAST_EIO, "record unreadable");
    const int32_t peer = a.op == BALLAST_OP_BROADCAST ? a.root : -1;
    if (s.seq != i + 1 || s.op != a.op || s.count != a.count || s.bytes != a.count * 4 || s.peer != peer ||
        s.state != BALLAST_TRACE_DONE || s.start_tick < s.issue_tick)
      return test::child_fail(rank, BALLAST_EIO,
                              "record " + std::to_string(i) + ": seq " + std::to_string(s.seq) + ", " +
                                  ballast_op_name(s.op) + " of " + std::to_string(s.count) + ", peer " +
                                  std::to_string(s.peer) + "; expected " + ballast_op_name(a.op) + " of " +
                                  std::to_string(a.count) + ", peer " + std::to_string(peer));
  }
  comm_destroy(c);
  return 0;
}

TEST_CASE("requests reused for other operations: each record describes its own") {
  const int port = test::reserve_ports(1);
  expect_all_ok(test::run_ranks(2, "sm,self", 60, [&](int rank) { return records_of_reused_requests(rank, port); }));
}

// An operation of one communicator in flight while another runs more
// operations than the ring has slots (a long data-parallel allreduce beside
// tensor-parallel traffic): the ring's writers go round it, so its record
// stays readable while it runs, ends complete, and the records written
// around it keep their own progress.
int record_in_flight_while_ring_laps(int rank, int port) {
  auto cfg = test::config(rank, 2, port, 20000);
  Comm* c = nullptr;
  Comm* sub = nullptr;
  if (int rc = comm_init(&cfg, &c); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  if (int rc = comm_split(c, 0, rank, &sub); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  ballast_comm_info world{}, part{};
  world.size = part.size = sizeof world;
  comm_info(c, &world);
  comm_info(sub, &part);
  TraceRing* ring = TraceRing::current();
  std::vector<float> in(1000, float(rank + 1)), out(1000);
  const auto long_op = test::args_of(BALLAST_OP_ALLREDUCE, in.data(), out.data(), in.size());
  ballast_comm_request* r = nullptr;
  const uint64_t mine = ring->head();
  if (rank == 0)  // rank 1 joins it only after the loop below
    if (int rc = comm_start(sub, &long_op, &r); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  float x = 1, y = 0;
  const auto short_op = test::args_of(BALLAST_OP_ALLREDUCE, &x, &y, 1);
  for (uint32_t k = 0; k < 3 * ring->capacity(); ++k)
    if (int rc = comm_run(c, &short_op); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  ballast_trace_slot s;
  if (rank == 0 && (!ring->read(mine, &s) || s.comm_id != part.comm_id || s.state != BALLAST_TRACE_STARTED))
    return test::child_fail(rank, BALLAST_EIO, "the operation in flight lost its record when the ring went round");
  if (rank == 1)
    if (int rc = comm_start(sub, &long_op, &r); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  if (int rc = comm_wait(r); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  if (out[999] != 3) return test::child_fail(rank, BALLAST_EIO, "the long allreduce's result");
  if (rank == 0 && (!ring->read(mine, &s) || s.state != BALLAST_TRACE_DONE || s.bytes_received != 4000))
    return test::child_fail(rank, BALLAST_EIO, "the long operation's record did not end with its own progress");
  const uint64_t head = ring->head();
  int others = 0;
  for (uint64_t i = head - ring->capacity(); i < head; ++i) {
    if (!ring->read(i, &s) || s.comm_id != world.comm_id) continue;
    ++others;
    if (s.state != BALLAST_TRACE_DONE || s.bytes_received != 4 || s.bytes_sent != 4)
      return test::child_fail(rank, BALLAST_EIO,
                              "record " + std::to_string(i) + " (seq " + std::to_string(s.seq) +
                                  ") holds another operation's progress: received " + std::to_string(s.bytes_received));
  }
  if (others < int(ring->capacity()) - 2)
    return test::child_fail(rank, BALLAST_EIO, "records of the short operations missing");
  comm_destroy(sub);
  comm_destroy(c);
  return 0;
}

TEST_CASE("an operation in flight keeps its record while the ring goes round it") {
  for (const char* tls : {"sm,self", "tcp"}) {
    INFO(tls);
    const int port = test::reserve_ports(1);
    expect_all_ok(test::run_ranks(2, tls, 60, [&](int rank) { return record_in_flight_while_ring_laps(rank, port); }));
  }
}

TEST_CASE("a failure ends every operation queued behind it, each with the first failure's cause") {
  const int port = test::reserve_ports(1);
  const auto r = test::run_ranks(2, "sm,self", 60, [&](int rank) {
    auto cfg = test::config(rank, 2, port, 20000);
    Comm* c = nullptr;
    if (int rc = comm_init(&cfg, &c); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    if (rank == 1) {  // joins nothing: rank 0's first allreduce waits for it until aborted
      sleep(3);
      comm_destroy(c);
      return 0;
    }
    std::vector<float> buf(1000, 1);
    std::vector<ballast_comm_request*> reqs(5);
    for (auto*& q : reqs) {
      auto a = test::args_of(BALLAST_OP_ALLREDUCE, buf.data(), buf.data(), buf.size());
      if (int rc = comm_start(c, &a, &q); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    }
    int done = 0;
    if (comm_test(reqs[4], &done) != BALLAST_OK || done)
      return test::child_fail(rank, BALLAST_EIO, "done without rank 1");
    comm_abort(c, "test abort");
    for (size_t k = 0; k < reqs.size(); ++k) {
      const int rc = comm_wait(reqs[k]);
      const std::string msg = last_error();
      if (rc != BALLAST_EABORTED || msg.find("seq " + std::to_string(k + 1)) == std::string::npos ||
          msg.find("test abort") == std::string::npos)
        return test::child_fail(rank, BALLAST_EIO, "op " + std::to_string(k) + ": " + std::to_string(rc) + " " + msg);
    }
    auto a = test::args_of(BALLAST_OP_ALLREDUCE, buf.data(), buf.data(), buf.size());
    if (comm_run(c, &a) == BALLAST_OK) return test::child_fail(rank, BALLAST_EIO, "ran after the abort");
    comm_destroy(c);
    return 0;
  });
  expect_all_ok(r);
}

TEST_CASE("a communicator takes 64 operations not yet completed; the 65th start says so") {
  const int port = test::reserve_ports(1);
  const auto r = test::run_ranks(1, "sm,self", 60, [&](int rank) {
    auto cfg = test::config(rank, 1, port, 20000);
    Comm* c = nullptr;
    if (int rc = comm_init(&cfg, &c); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
    ballast_comm_info info{};
    info.size = sizeof info;
    if (comm_info(c, &info) != BALLAST_OK || info.max_in_flight != 64)
      return test::child_fail(rank, BALLAST_EIO, "info.max_in_flight is " + std::to_string(info.max_in_flight));
    ballast_comm_info older{};  // as a caller built before the field existed passes it
    older.size = offsetof(ballast_comm_info, max_in_flight);
    older.max_in_flight = 7;
    if (comm_info(c, &older) != BALLAST_OK || older.nranks != 1 || older.max_in_flight != 7)
      return test::child_fail(rank, BALLAST_EIO, "info with the older size");
    std::vector<float> buf(16, 1);
    std::vector<ballast_comm_request*> reqs;
    for (int k = 0; k < 65; ++k) {
      auto a = test::args_of(BALLAST_OP_ALLREDUCE, buf.data(), buf.data(), buf.size());
      ballast_comm_request* q = nullptr;
      const int rc = comm_start(c, &a, &q);
      if (k < 64 && rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
      if (k == 64 && (rc != BALLAST_EFULL || std::string(last_error()).find("64 operations") == std::string::npos))
        return test::child_fail(rank, BALLAST_EIO, "65th start: " + std::to_string(rc) + " " + last_error());
      if (q) reqs.push_back(q);
    }
    if (comm_wait(reqs.front()) != BALLAST_OK) return test::child_fail(rank, BALLAST_EIO, last_error());
    auto a = test::args_of(BALLAST_OP_ALLREDUCE, buf.data(), buf.data(), buf.size());
    ballast_comm_request* q = nullptr;
    if (comm_start(c, &a, &q) != BALLAST_OK) return test::child_fail(rank, BALLAST_EIO, "a start after one completed");
    comm_destroy(c);  // 64 left in flight: destroy cancels what is left, no leak, no hang
    return 0;
  });
  expect_all_ok(r);
}
