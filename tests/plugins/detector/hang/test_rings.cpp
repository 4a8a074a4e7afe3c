// Trace-ring files as the hang detector reads them: the writer of
// plugins/comm/common (the one both comm plugins use) and read_dir, with
// real files, real mappings and a real second process.
#include <doctest/doctest.h>

#include <analysis.hpp>
#include <rings.hpp>
#include <trace_ring.hpp>

#include "../../comm/ucx/scratch_dir.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace fs = std::filesystem;
using ballast::comm::TraceRing;
using ballast::hang::RankRing;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string d = test::scratch() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string ring_path(const std::string& dir, int rank, int pid, const std::string& writer) {
  return dir + "/rank-" + std::to_string(rank) + "." + std::to_string(pid) + "." + writer + ".btrace";
}

TraceRing* make_ring(const std::string& path, int rank) {
  // Rings live as long as the process, as in a plugin: held where exit does not free them.
  static auto* made = new std::vector<TraceRing*>;
  std::string err;
  TraceRing* r = TraceRing::create(path, rank, 2, &err);
  REQUIRE_MESSAGE(r, err);
  made->push_back(r);
  return r;
}

// A finished (or, with done false, running) allreduce of `comm`, whose
// members are `nranks` (0: not said), this one `rank`; at this moment on a
// ring whose clock set_header moved `behind_ns` back.
void add(TraceRing* r, uint64_t comm, uint64_t seq, bool done, int32_t rank = 0, int32_t nranks = 0,
         int64_t behind_ns = 0) {
  uint64_t i = 0;
  ballast_trace_slot* s = r->claim(&i);
  if (!s) FAIL("every slot of the ring holds a record in flight");
  s->comm_id = comm;
  s->rank = s->world_rank = rank;
  s->nranks = nranks;
  s->seq = seq;
  s->op = BALLAST_OP_ALLREDUCE;
  s->peer = -1;
  s->issue_tick = s->start_tick = ballast::comm::trace_tick() + uint64_t(behind_ns);
  s->end_tick = done ? s->start_tick + 1000 : 0;
  s->state = done ? BALLAST_TRACE_DONE : BALLAST_TRACE_STARTED;
  TraceRing::publish(s, i);
}

const RankRing* of_rank(const std::vector<RankRing>& rings, int rank) {
  for (const auto& r : rings)
    if (r.header.rank == rank) return &r;
  return nullptr;
}

}  // namespace

TEST_CASE("the rings of one process's two comm plugins are read as one rank, the newest process of each rank") {
  const std::string dir = fresh_dir("two-writers");
  const int self = int(getpid());
  // Rank 1 ran before in another process (a restart): its ring must lose to this one.
  const pid_t old = fork();
  REQUIRE(old >= 0);
  if (old == 0) {
    std::string err;
    TraceRing* r = TraceRing::create(ring_path(dir, 1, int(getpid()), "ucx"), 1, 2, &err);
    if (!r) _exit(1);
    for (uint64_t seq = 1; seq <= 9; ++seq) add(r, 0x99, seq, true);
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(old, &status, 0) == old);
  REQUIRE(WEXITSTATUS(status) == 0);
  usleep(2000);  // this process's rings are made later: a later clock_wall_ns

  TraceRing* ucx = make_ring(ring_path(dir, 0, self, "ucx"), 0);
  TraceRing* nccl = make_ring(ring_path(dir, 0, self, "nccl"), 0);
  TraceRing* rank1 = make_ring(ring_path(dir, 1, self, "ucx"), 1);
  // 100 us apart: far more than the two rings' clocks can differ once merged.
  for (auto [ring, comm, seq, done] :
       {std::tuple{ucx, 0x11, 1, true}, {nccl, 0x22, 1, true}, {ucx, 0x11, 2, false}, {nccl, 0x22, 2, false}}) {
    add(ring, uint64_t(comm), uint64_t(seq), done);
    usleep(100);
  }
  add(rank1, 0x11, 1, true);
  ucx->set_closed(true);  // one writer shut down; the process as a whole did not

  std::vector<std::string> errors;
  const auto rings = ballast::hang::read_dir(dir, &errors);
  CHECK(errors.empty());
  REQUIRE(rings.size() == 2);
  const RankRing* r0 = of_rank(rings, 0);
  REQUIRE(r0);
  CHECK(r0->header.pid == self);
  CHECK(r0->header.head == 4);
  CHECK(r0->header.closed == 0);
  CHECK(r0->path.find(".ucx.btrace") != std::string::npos);
  CHECK(r0->path.find(".nccl.btrace") != std::string::npos);
  REQUIRE(r0->records.size() == 4);
  // Oldest first, both writers' records, ticks on one clock: the order they were issued in.
  std::vector<std::pair<uint64_t, uint64_t>> order;
  for (const auto& s : r0->records) order.push_back({s.comm_id, s.seq});
  CHECK(order == std::vector<std::pair<uint64_t, uint64_t>>{{0x11, 1}, {0x22, 1}, {0x11, 2}, {0x22, 2}});
  CHECK(r0->records[3].end_tick == 0);  // still running: no end invented by the merge
  // The nccl ring's ticks, moved onto the ucx ring's clock (both CLOCK_MONOTONIC here), hardly move.
  ballast_trace_slot written;
  REQUIRE(nccl->read(0, &written));
  CHECK(std::llabs(int64_t(r0->records[1].issue_tick - written.issue_tick)) < 1000000);
  const RankRing* r1 = of_rank(rings, 1);
  REQUIRE(r1);
  CHECK(r1->header.pid == self);  // not the older process's
  REQUIRE(r1->records.size() == 1);
  CHECK(r1->records[0].comm_id == 0x11);

  nccl->set_closed(true);
  errors.clear();
  const auto later = ballast::hang::read_dir(dir, &errors);
  REQUIRE(of_rank(later, 0));
  CHECK(of_rank(later, 0)->header.closed == 1);
}

TEST_CASE("a ring made again at the same path leaves a reader's mapping of the old one intact") {
  const std::string dir = fresh_dir("remake");
  const std::string path = ring_path(dir, 0, int(getpid()), "ucx");
  TraceRing* first = make_ring(path, 0);
  add(first, 0x11, 1, true);
  const int fd = open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  const size_t bytes = sizeof(ballast_trace_header) + first->capacity() * sizeof(ballast_trace_slot);
  void* mem = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  REQUIRE(mem != MAP_FAILED);
  make_ring(path, 0);  // as a new process with the same pid would
  // The reader still sees the old ring whole (a truncation would zero it, or fault).
  const auto* h = static_cast<const ballast_trace_header*>(mem);
  CHECK(h->magic == BALLAST_TRACE_MAGIC);
  CHECK(__atomic_load_n(&h->head, __ATOMIC_ACQUIRE) == 1);
  munmap(mem, bytes);
  // The path holds the new, empty ring, and nothing else is left in the folder.
  RankRing now;
  std::string err;
  REQUIRE_MESSAGE(ballast::hang::read_ring(path, &now, &err), err);
  CHECK(now.header.head == 0);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  CHECK(names == std::set<std::string>{fs::path(path).filename().string()});
}

TEST_CASE("a new ring is allocated and mapped whole: its first lap of records takes no page fault") {
  TraceRing* r = make_ring(ring_path(fresh_dir("faults"), 0, int(getpid()), "ucx"), 0);
  rusage before{}, after{};
  getrusage(RUSAGE_THREAD, &before);
  for (uint32_t k = 0; k < r->capacity(); ++k) add(r, 0x22, k + 1, true);
  getrusage(RUSAGE_THREAD, &after);
  // One fault per 4 KiB page (21 records) when the pages are left to the
  // first writes: 48 over the ring. A sanitizer's own shadow memory may take a few.
  CHECK(after.ru_minflt - before.ru_minflt < 8);
  CHECK(after.ru_majflt == before.ru_majflt);
}

// A long collective in flight on one communicator while the ranks run more
// operations on another than the ring holds (a data-parallel allreduce beside
// tensor-parallel traffic): the writer goes round its slot, the reader finds
// it, and the analysis places rank 0 in it and names rank 1, which never
// joined it.
TEST_CASE("a record in flight older than the ring's last lap is read, and the rank missing from it is named") {
  const std::string dir = fresh_dir("gone-round");
  const std::string path0 = ring_path(dir, 0, int(getpid()), "ucx");
  TraceRing* r0 = make_ring(path0, 0);
  TraceRing* r1 = make_ring(ring_path(dir, 1, int(getpid()), "ucx"), 1);
  add(r0, 0xa, 1, false, 0, 2);
  const uint64_t cap = r0->capacity(), ops = 2 * cap + 5;
  for (uint64_t k = 0; k < ops; ++k) {
    add(r0, 0xb, k + 1, true, 0, 2);
    add(r1, 0xb, k + 1, true, 1, 2);
  }
  RankRing read;
  std::string err;
  REQUIRE_MESSAGE(ballast::hang::read_ring(path0, &read, &err), err);
  REQUIRE(read.records.size() == cap);  // the one in flight and the newest cap - 1
  CHECK(read.records.front().comm_id == 0xa);
  CHECK(read.records.front().state == BALLAST_TRACE_STARTED);
  for (uint64_t i = 1; i < cap; ++i) CHECK(read.records[i].seq == ops - cap + 1 + i);
  CHECK(read.overflow == ops - (cap - 1));  // the indices gone round are not counted
  CHECK(read.dropped == 0);

  std::vector<std::string> errors;
  const auto v = ballast::hang::analyze(ballast::hang::read_dir(dir, &errors), {});
  INFO(v.to_text());
  CHECK(errors.empty());
  CHECK(v.verdict == "hang");
  CHECK(v.comm_id == 0xa);
  REQUIRE(v.causes.size() == 1);
  CHECK(v.causes[0].rank == 1);
  CHECK(v.causes[0].kind == "not_joined");
}

// The writer's contract with several threads: four threads write at once,
// each holding every 50th of its operations in flight over its next 2,000
// (the ring goes round them), while a reader copies slots: every copy is
// whole, no record in flight is ever overwritten, and the claims add up.
TEST_CASE("several threads write at once: copies are whole, records in flight are never overwritten") {
  TraceRing* r = make_ring(ring_path(fresh_dir("threads"), 0, int(getpid()), "ucx"), 0);
  constexpr int kThreads = 4;
  constexpr uint64_t kOps = 20000;
  std::atomic<int> writers{kThreads};
  std::atomic<uint64_t> overwritten{0}, torn{0}, copies{0};
  auto fill = [](ballast_trace_slot* s, uint64_t thread, uint64_t seq) {
    s->comm_id = thread;
    s->seq = seq;
    s->count = seq * 3 + 1;
    s->bytes = seq * 5 + 2 + thread;
    s->end_tick = 0;
    s->state = BALLAST_TRACE_STARTED;
  };
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::vector<std::tuple<uint64_t, ballast_trace_slot*, uint64_t>> held;  // until, slot, index
      for (uint64_t j = 1; j <= kOps; ++j) {
        uint64_t i = 0;
        ballast_trace_slot* s = r->claim(&i);
        if (!s) continue;
        fill(s, t, j);
        TraceRing::publish(s, i);
        if (j % 50 == 0)
          held.emplace_back(j + 2000, s, i);
        else
          __atomic_store_n(&s->state, BALLAST_TRACE_DONE, __ATOMIC_RELEASE);
        for (auto it = held.begin(); it != held.end();)
          if (std::get<0>(*it) <= j) {
            // Still ours: the claims of the other threads went round it.
            if (!r->holds(std::get<2>(*it), std::get<2>(*it))) ++overwritten;
            __atomic_store_n(&std::get<1>(*it)->state, BALLAST_TRACE_DONE, __ATOMIC_RELEASE);
            it = held.erase(it);
          } else {
            ++it;
          }
      }
      for (auto& h : held) __atomic_store_n(&std::get<1>(h)->state, BALLAST_TRACE_DONE, __ATOMIC_RELEASE);
      --writers;
    });
  std::thread reader([&] {
    do {
      for (uint64_t k = 0; k < r->capacity(); ++k) {
        uint64_t i = 0;
        ballast_trace_slot s;
        if (!r->read_slot(k, &i, &s)) continue;
        ++copies;
        if (s.count != s.seq * 3 + 1 || s.bytes != s.seq * 5 + 2 + s.comm_id || (i & (r->capacity() - 1)) != k) ++torn;
      }
    } while (writers.load() > 0);
  });
  for (auto& t : threads) t.join();
  reader.join();
  CHECK(overwritten == 0);
  CHECK(torn == 0);
  CHECK(copies > 0);
  CHECK(r->skipped() > 0);
  CHECK(r->dropped() == 0);
  CHECK(r->head() == kThreads * kOps + r->skipped());
}

namespace {

// The pid of a process that has ended (and was reaped).
pid_t ended_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

// Rewrite the header of the ring at `path`: its process `pid`, its last
// heartbeat `ago_ns` before now, and, when given, its host. The ring's clock
// is moved, not its ticks: the heartbeat stays at the tick it was made, and
// that tick is said to be `ago_ns` earlier on the wall clock, so that no
// tick is computed by going back from a monotonic reading (a machine booted
// less than `ago_ns` ago has no such tick). Records made after this carry
// ticks of that earlier timeline: make them with add(..., ago_ns).
void set_header(const std::string& path, int32_t pid, int64_t ago_ns, const char* host = nullptr) {
  const int fd = open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  ballast_trace_header h{};
  REQUIRE(pread(fd, &h, sizeof h, 0) == ssize_t(sizeof h));
  h.pid = pid;
  h.heartbeat_tick = h.clock_tick;
  h.clock_wall_ns -= ago_ns;
  if (host) std::snprintf(h.host, sizeof h.host, "%s", host);
  REQUIRE(pwrite(fd, &h, sizeof h, 0) == ssize_t(sizeof h));
  close(fd);
}

}  // namespace

// A node whose jobs restart all day leaves a ring per rank per restart: the
// folder keeps the newest of those whose process ended, and removes none
// that may still be of use.
TEST_CASE("rings of processes ended and idle 10 minutes are removed beyond the newest kept; the others stay") {
  const std::string dir = fresh_dir("prune");
  const pid_t dead = ended_pid();
  constexpr int64_t kMinute = 60'000'000'000;
  std::vector<std::string> old;
  for (int k = 0; k < 4; ++k) {
    old.push_back(ring_path(dir, k, dead, "ucx"));
    make_ring(old.back(), k);
    set_header(old.back(), dead, (20 + 10 * k) * kMinute);
  }
  const std::string recent = ring_path(dir, 4, dead, "ucx");  // ended a minute ago: a post-mortem may read it
  make_ring(recent, 4);
  set_header(recent, dead, kMinute);
  const std::string busy = ring_path(dir, 5, dead, "ucx");  // no heartbeat for an hour, a record just now
  TraceRing* b = make_ring(busy, 5);
  set_header(busy, dead, 60 * kMinute);
  add(b, 0x1, 1, true, 0, 0, 60 * kMinute);
  const std::string live = ring_path(dir, 6, int(getpid()), "ucx");  // its process runs
  make_ring(live, 6);
  set_header(live, int32_t(getpid()), 60 * kMinute);
  const std::string other = ring_path(dir, 7, dead, "ucx");  // another host's: its processes are not seen from here
  make_ring(other, 7);
  set_header(other, dead, 60 * kMinute, "another-host");
  const std::string junk = dir + "/notes.btrace";
  std::FILE* f = std::fopen(junk.c_str(), "w");
  REQUIRE(f);
  std::fputs("not a ring", f);
  std::fclose(f);

  CHECK(TraceRing::prune(dir, 2) == 2);  // the two idle longest
  CHECK(fs::exists(old[0]));
  CHECK(fs::exists(old[1]));
  CHECK_FALSE(fs::exists(old[2]));
  CHECK_FALSE(fs::exists(old[3]));
  for (const auto& p : {recent, busy, live, other, junk}) CHECK_MESSAGE(fs::exists(p), p);
  CHECK(TraceRing::prune(dir, 0) == 2);
  for (const auto& p : {recent, busy, live, other, junk}) CHECK_MESSAGE(fs::exists(p), p);
}

TEST_CASE("a BALLAST_TRACE_KEEP that is not a count or \"all\" is an error naming it") {
  const std::string dir = fresh_dir("keep-setting");
  const pid_t pid = fork();
  if (pid == 0) {  // a process of its own: its first ring
    setenv("BALLAST_TRACE_KEEP", "ten", 1);
    std::string err;
    const bool refused = !TraceRing::process_ring("ucx", dir, 0, 1, &err) &&
                         err == "BALLAST_TRACE_KEEP=ten: not a count of rings or \"all\"";
    _exit(refused ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(fs::is_empty(dir));
}

namespace {

// The error read_ring gives for a ring whose header holds `value` at `offset`.
template <class T>
std::string refusal(const std::string& name, size_t offset, T value) {
  const std::string path = ring_path(fresh_dir(name), 0, int(getpid()), "ucx");
  make_ring(path, 0);
  const int fd = open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  REQUIRE(pwrite(fd, &value, sizeof value, off_t(offset)) == sizeof value);
  close(fd);
  RankRing r;
  std::string err;
  CHECK_FALSE(ballast::hang::read_ring(path, &r, &err));
  CHECK(err.find(path) == 0);
  return err;
}

}  // namespace

TEST_CASE("a ring whose clock says nothing is refused, naming the field") {
  const std::string err = refusal("bad-clock", offsetof(ballast_trace_header, ns_per_tick), 0.0);
  CHECK(err.find("field ns_per_tick") != std::string::npos);
}

TEST_CASE("a ring whose rank lies outside its world is refused, naming the field") {
  CHECK(refusal("rank-past", offsetof(ballast_trace_header, rank), int32_t(99))
            .find("field rank 99 is outside a world of") != std::string::npos);
  CHECK(refusal("rank-negative", offsetof(ballast_trace_header, rank), int32_t(-2)).find("field rank -2") !=
        std::string::npos);
  CHECK(refusal("nranks-negative", offsetof(ballast_trace_header, nranks), int32_t(-5)).find("a world of -5") !=
        std::string::npos);
}

TEST_CASE("a process forked after its ring was made writes a ring of its own") {
  const std::string dir = fresh_dir("forked");
  std::string err;
  TraceRing* parent = TraceRing::process_ring("ucx", dir, 0, 2, &err);
  REQUIRE_MESSAGE(parent, err);
  CHECK(TraceRing::current() == parent);
  const pid_t kid = fork();
  if (kid == 0) {
    // Not the parent's ring (its file names the parent's pid and rank): the
    // child's records would go to the parent's file, and its writes would
    // contend with the parent's for the same head.
    if (TraceRing::current() != nullptr) _exit(1);
    std::string e;
    TraceRing* own = TraceRing::process_ring("ucx", dir, 1, 2, &e);
    _exit(own && own != parent && TraceRing::current() == own ? 0 : 2);
  }
  REQUIRE(kid > 0);
  int st = 0;
  REQUIRE(waitpid(kid, &st, 0) == kid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(TraceRing::process_ring("ucx", dir, 0, 2, &err) == parent);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  CHECK(names == std::set<std::string>{fs::path(ring_path(dir, 0, int(getpid()), "ucx")).filename().string(),
                                       fs::path(ring_path(dir, 1, int(kid), "ucx")).filename().string()});
}

TEST_CASE("the rings' last progress is their newest tick on the wall clock, 0 before any record") {
  const std::string dir = fresh_dir("last-progress");
  const int self = int(getpid());
  TraceRing* r0 = make_ring(ring_path(dir, 0, self, "ucx"), 0);
  TraceRing* r1 = make_ring(ring_path(dir, 1, self, "ucx"), 1);
  std::vector<std::string> errors;
  CHECK(ballast::hang::last_progress_ns(ballast::hang::read_dir(dir, &errors)) == 0);
  add(r0, 0x11, 1, true);
  add(r1, 0x11, 1, false, 0, 0, 5000000);  // started 5 ms after rank 0's ended: the newest
  const auto rings = ballast::hang::read_dir(dir, &errors);
  CHECK(errors.empty());
  const RankRing* a = of_rank(rings, 0);
  const RankRing* b = of_rank(rings, 1);
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(a->records.size() == 1);
  REQUIRE(b->records.size() == 1);
  const int64_t newest = b->wall_ns(b->records[0].start_tick);
  CHECK(newest > a->wall_ns(a->records[0].end_tick));
  CHECK(ballast::hang::last_progress_ns(rings) == newest);
}
