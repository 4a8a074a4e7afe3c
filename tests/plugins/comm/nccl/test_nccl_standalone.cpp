// The stand-alone NCCL profiler plugin (ballast-nccl-profiler.so) as NCCL
// loads it: dlopen'd by path, its ncclProfiler_v5 table driven with the
// callbacks and descriptors NCCL documents, for communicators that are not
// Ballast's (a framework's own), in real processes, one per rank. Their
// rings are read by the hang analysis as after comm-nccl or comm-ucx: the
// same verdicts. NCCL itself needs a GPU to call it: these run without one.
#include <doctest/doctest.h>

#include <nccl_profiler_v5.h>
#include <analysis.hpp>
#include <rings.hpp>

#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const ballast_nccl_profiler_v5* profiler() {
  static const ballast_nccl_profiler_v5* p = [] {
    const std::string path = std::string(BALLAST_BINARY_DIR) + "/lib/ballast/ballast-nccl-profiler.so";
    void* so = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE_MESSAGE(so, dlerror());
    auto* t = static_cast<const ballast_nccl_profiler_v5*>(dlsym(so, "ncclProfiler_v5"));
    REQUIRE(t);
    return t;
  }();
  return p;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = fs::temp_directory_path() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// One rank's side of a communicator, as NCCL drives the profiler.
struct Comm {
  const ballast_nccl_profiler_v5* p = profiler();
  void* ctx = nullptr;
  int mask = 0;

  Comm(uint64_t id, const char* name, int nranks, int rank) {
    REQUIRE(p->init(&ctx, id, &mask, name, 1, nranks, rank, nullptr) == ncclSuccess);
  }
  // Enqueue a collective (its event starts and stops on the caller's
  // thread); returns its handle, the parent of its kernel's channels.
  void* enqueue(const char* func, size_t count = 1024, int root = -1, uint8_t channels = 2) {
    ballast_nccl_prof_descr_v5 d{};
    d.type = NCCL_PROF_COLL;
    d.coll.func = func;
    d.coll.count = count;
    d.coll.root = root;
    d.coll.datatype = "ncclFloat32";
    d.coll.nChannels = channels;
    void* h = nullptr;
    REQUIRE(p->startEvent(ctx, &h, &d) == ncclSuccess);
    REQUIRE(h != nullptr);
    REQUIRE(p->stopEvent(h) == ncclSuccess);  // stop: enqueued, not done
    return h;
  }
  void* channel_start(void* op, uint8_t channel) {
    ballast_nccl_prof_descr_v5 d{};
    d.type = NCCL_PROF_KERNEL_CH;
    d.parentObj = op;
    d.kernelCh.channelId = channel;
    void* h = nullptr;
    REQUIRE(p->startEvent(ctx, &h, &d) == ncclSuccess);
    return h;
  }
  // A collective that runs to its end: both channels start and stop.
  void run(const char* func, int root = -1) {
    void* op = enqueue(func, 1024, root);
    void* a = channel_start(op, 0);
    void* b = channel_start(op, 1);
    p->stopEvent(a);
    p->stopEvent(b);
  }
  void finalize() { REQUIRE(p->finalize(ctx) == ncclSuccess); }
};

// Run `body(rank)` in `n` processes (RANK and BALLAST_TRACE_DIR set); each
// signals when done and then stays (pause) unless body returned true (it
// exits, and is reaped before the analysis). Waits for all, analyses the
// folder, kills and reaps those left.
ballast::hang::Verdict ranks(const std::string& dir, int n, const std::function<bool(int)>& body,
                             std::vector<ballast::hang::RankRing>* rings_out = nullptr) {
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("BALLAST_TRACE_DIR", dir.c_str(), 1);
      const bool leave = body(r);
      const char said = char(r * 2 + (leave ? 1 : 0));  // which rank, and whether it exits now
      if (write(ready[1], &said, 1) != 1) _exit(2);
      if (leave) _exit(0);
      for (;;) pause();
    }
    pids.push_back(pid);
  }
  std::vector<bool> reaped(size_t(n), false);
  for (int k = 0; k < n; ++k) {
    char c = 0;
    REQUIRE(read(ready[0], &c, 1) == 1);
    if (c % 2) {  // it exits: gone before the analysis
      waitpid(pids[size_t(c / 2)], nullptr, 0);
      reaped[size_t(c / 2)] = true;
    }
  }
  close(ready[0]);
  close(ready[1]);
  std::vector<std::string> errors;
  auto rings = ballast::hang::read_dir(dir, &errors);
  CHECK(errors.empty());
  auto v = ballast::hang::analyze(rings, {});
  for (int r = 0; r < n; ++r) {
    if (reaped[size_t(r)]) continue;
    kill(pids[size_t(r)], SIGKILL);
    waitpid(pids[size_t(r)], nullptr, 0);
  }
  if (rings_out) *rings_out = std::move(rings);
  return v;
}

constexpr uint64_t kComm = 0x5eedfeed;  // NCCL's communicator hash: equal on every member

}  // namespace

TEST_CASE("every collective of a framework's communicator is recorded; a clean job is healthy") {
  const std::string dir = fresh_dir("standalone-healthy");
  std::vector<ballast::hang::RankRing> rings;
  const auto v = ranks(
      dir, 3,
      [](int r) {
        Comm c(kComm, "pytorch-pg-0", 3, r);
        for (int i = 0; i < 5; ++i) c.run("AllReduce");
        c.run("Broadcast", 0);
        c.finalize();
        return true;
      },
      &rings);
  INFO(v.to_text());
  CHECK(v.verdict == "healthy");
  REQUIRE(rings.size() == 3);
  for (const auto& ring : rings) {
    CHECK(ring.header.closed == 1);
    CHECK(ring.path.find(".ncclprof.btrace") != std::string::npos);
    REQUIRE(ring.records.size() == 6);
    for (size_t i = 0; i < 6; ++i) {
      const auto& s = ring.records[i];
      CHECK(s.comm_id == kComm);
      CHECK(s.seq == i + 1);
      CHECK(s.state == BALLAST_TRACE_DONE);
      CHECK(s.start_tick >= s.issue_tick);
      CHECK(s.end_tick >= s.start_tick);
      CHECK(s.nranks == 3);
      CHECK(s.world_rank == ring.header.rank);
      CHECK(s.algorithm == BALLAST_ALGO_NCCL);
    }
    CHECK(ring.records[0].op == BALLAST_OP_ALLREDUCE);
    CHECK(ring.records[0].dtype == BALLAST_DT_F32);
    CHECK(ring.records[0].bytes == 4096);
    CHECK(ring.records[5].op == BALLAST_OP_BROADCAST);
    CHECK(ring.records[5].peer == 0);
  }
}

TEST_CASE("a rank that never enqueues the collective the others run is named not_joined") {
  const auto v = ranks(fresh_dir("standalone-hang"), 3, [](int r) {
    Comm c(kComm, "pytorch-pg-0", 3, r);
    for (int i = 0; i < 4; ++i) c.run("AllReduce");
    if (r != 2) c.channel_start(c.enqueue("AllReduce"), 0);  // running, waiting for rank 2
    return false;
  });
  INFO(v.to_text());
  CHECK(v.verdict == "hang");
  CHECK(v.seq == 5);
  REQUIRE(v.causes.size() == 1);
  CHECK(v.causes[0].rank == 2);
  CHECK(v.causes[0].kind == "not_joined");
}

TEST_CASE("a rank gone in the middle of the job is named crashed") {
  const auto v = ranks(fresh_dir("standalone-crash"), 3, [](int r) {
    Comm c(kComm, "pytorch-pg-0", 3, r);
    for (int i = 0; i < 4; ++i) c.run("AllReduce");
    if (r != 1) c.channel_start(c.enqueue("AllReduce"), 0);
    return r == 1;  // exits without finalizing its communicator
  });
  INFO(v.to_text());
  REQUIRE(v.causes.size() == 1);
  CHECK(v.causes[0].rank == 1);
  CHECK(v.causes[0].kind == "crashed");
}

TEST_CASE("a rank in another collective at the same seq is named mismatch") {
  const auto v = ranks(fresh_dir("standalone-mismatch"), 3, [](int r) {
    Comm c(kComm, "pytorch-pg-0", 3, r);
    for (int i = 0; i < 4; ++i) c.run("AllReduce");
    c.channel_start(r == 2 ? c.enqueue("Broadcast", 1024, 0) : c.enqueue("AllReduce"), 0);
    return false;
  });
  INFO(v.to_text());
  CHECK(v.verdict == "mismatch");
  REQUIRE(v.causes.size() == 1);
  CHECK(v.causes[0].rank == 2);
}

TEST_CASE("operations run in order: a later kernel's start ends the ones before it; queued ones stay issued") {
  const std::string dir = fresh_dir("standalone-order");
  std::vector<ballast::hang::RankRing> rings;
  ranks(
      dir, 1,
      [](int r) {
        Comm c(0x77, "nccl-user-comm", 1, r);
        void* first = c.enqueue("AllReduce");
        c.channel_start(first, 0);  // its stops never come (the proxy missed them)
        void* second = c.enqueue("AllGather");
        c.enqueue("ReduceScatter");  // queued behind
        c.channel_start(second, 0);
        return false;
      },
      &rings);
  REQUIRE(rings.size() == 1);
  const auto& rec = rings[0].records;
  REQUIRE(rec.size() == 3);
  CHECK(rec[0].state == BALLAST_TRACE_DONE);
  CHECK(rec[1].state == BALLAST_TRACE_STARTED);
  CHECK(rec[2].state == BALLAST_TRACE_ISSUED);
  CHECK(rec[2].start_tick == 0);
  CHECK(rec[2].op == BALLAST_OP_REDUCE_SCATTER);
}

TEST_CASE("sends and receives count per peer; comm-nccl's own communicators are left to it") {
  const std::string dir = fresh_dir("standalone-p2p");
  std::vector<ballast::hang::RankRing> rings;
  ranks(
      dir, 1,
      [](int r) {
        Comm mine(0x99, "ballast-42-0", 2, r);  // comm-nccl's: no events asked
        if (mine.ctx != nullptr || mine.mask != 0) _exit(3);
        Comm c(0x88, "pg-p2p", 2, r);
        for (const char* func : {"Send", "Send", "Recv"}) {
          ballast_nccl_prof_descr_v5 d{};
          d.type = NCCL_PROF_P2P;
          d.p2p.func = func;
          d.p2p.count = 10;
          d.p2p.datatype = "ncclBfloat16";
          d.p2p.peer = 1;
          d.p2p.nChannels = 1;
          void* h = nullptr;
          c.p->startEvent(c.ctx, &h, &d);
          c.p->stopEvent(h);
          c.p->stopEvent(c.channel_start(h, 0));
        }
        return false;
      },
      &rings);
  REQUIRE(rings.size() == 1);
  const auto& rec = rings[0].records;
  REQUIRE(rec.size() == 3);
  CHECK((rec[0].flags & BALLAST_TRACE_P2P) != 0);
  CHECK(rec[0].seq == 1);
  CHECK(rec[1].seq == 2);
  CHECK(rec[2].seq == 1);  // the receives from peer 1 count apart
  CHECK(rec[2].op == BALLAST_OP_RECV);
  CHECK(rec[0].dtype == BALLAST_DT_BF16);
  CHECK(rec[0].bytes == 20);
  for (const auto& s : rec) CHECK(s.state == BALLAST_TRACE_DONE);
}
