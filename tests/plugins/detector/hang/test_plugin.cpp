// The hang plugin inside a real host: it watches a folder of trace rings and
// publishes fault.confirmed when a communicator stops making progress. The
// rings are written here by hand, in the layout of abi/ballast/trace.h: two
// ranks, rank 0 waiting in seq 6 of an allreduce, rank 1 (a pid that no
// longer exists) last seen in seq 5.
#include <doctest/doctest.h>

#include <ballast/host.h>
#include <ballast/trace.h>

#include "../../comm/ucx/scratch_dir.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

void write_ring(const std::string& path, int rank, int pid, uint64_t last_seq, bool in_flight) {
  ballast_trace_header h{};
  h.magic = BALLAST_TRACE_MAGIC;
  h.version = BALLAST_TRACE_VERSION;
  h.header_size = sizeof h;
  h.slot_size = sizeof(ballast_trace_slot);
  h.slot_count = 16;
  h.pid = pid;
  h.rank = rank;
  h.nranks = 2;
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  h.clock_wall_ns = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  h.clock_tick = 1000000;
  h.ns_per_tick = 1.0;
  h.head = last_seq;
  gethostname(h.host, sizeof h.host - 1);
  std::vector<ballast_trace_slot> slots(16);
  for (uint64_t i = 0; i < last_seq; ++i) {
    ballast_trace_slot& s = slots[i];
    s.gen = i + 1;
    s.comm_id = 0xabc;
    s.seq = i + 1;
    s.count = 1024;
    s.bytes = 4096;
    s.op = BALLAST_OP_ALLREDUCE;
    s.rank = rank;
    s.nranks = 2;
    s.world_rank = rank;
    s.peer = -1;
    s.start_tick = 1000000 + i * 1000;
    const bool last = i + 1 == last_seq;
    s.state = last && in_flight ? BALLAST_TRACE_STARTED : BALLAST_TRACE_DONE;
    s.end_tick = s.state == BALLAST_TRACE_DONE ? s.start_tick + 500 : 0;
  }
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&h), sizeof h);
  f.write(reinterpret_cast<const char*>(slots.data()), std::streamsize(slots.size() * sizeof(ballast_trace_slot)));
}

struct Seen {
  std::mutex mu;
  std::vector<std::string> kinds;
  std::vector<int> ranks;
  std::string detector;
};

int on_fault(void* user, const ballast_event* e) {
  auto* seen = static_cast<Seen*>(user);
  const auto* f = static_cast<const ballast_fault_report*>(e->payload);
  std::lock_guard<std::mutex> lock(seen->mu);
  seen->kinds.push_back(f->kind);
  seen->ranks.push_back(f->rank);
  seen->detector = f->detector ? f->detector : "";
  return 0;
}

}  // namespace

TEST_CASE("the plugin publishes fault.confirmed naming the crashed rank after the stall time") {
  const std::string dir = test::scratch() / "plugin";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);  // a pid that is gone
  write_ring(dir + "/rank-0.1.btrace", 0, int(getpid()), 6, true);
  write_ring(dir + "/rank-1.2.btrace", 1, int(dead), 5, false);

  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("test", &host) == BALLAST_OK);
  const std::string config = "{ trace_dir = '" + dir + "', stall_seconds = 0.3, period_seconds = 0.05 }";
  REQUIRE_MESSAGE(ballast_host_load_plugin(host, (std::string(BALLAST_PLUGIN_DIR) + "/ballast-hang.so").c_str(),
                                           config.c_str()) == BALLAST_OK,
                  ballast_last_error());
  Seen seen;
  uint64_t sub = 0;
  REQUIRE(ballast_host_subscribe(host, "fault.confirmed", nullptr, on_fault, &seen, &sub) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);
  for (int i = 0; i < 3000; ++i) {  // up to 30 s
    {
      std::lock_guard<std::mutex> lock(seen.mu);
      if (!seen.kinds.empty()) break;
    }
    usleep(10000);
  }
  ballast_host_unsubscribe(host, sub);
  ballast_host_destroy(host);
  std::lock_guard<std::mutex> lock(seen.mu);
  REQUIRE(seen.kinds.size() == 1);
  CHECK(seen.kinds[0] == "crashed");
  CHECK(seen.ranks[0] == 1);
  CHECK(seen.detector == "hang");
}
