// The hang analysis as a fused input, end to end in the real host: the hang
// plugin reads trace rings (written here in the layout of
// abi/ballast/trace.h) of a job of 4 machines x 2 ranks whose rank 5, on
// machine m2, never entered the all-reduce the others wait in. No
// placement.plan: the rank reaches its machine through the ring's host. The
// machine detector (its fault.suspected, as its plugin publishes it) has
// already suspected another machine, m1. The fused ranking must name the
// hung rank's machine first, with the hang analysis's evidence.
#include <doctest/doctest.h>

#include <ballast/host.h>
#include <ballast/trace.h>
#include <nlohmann/json.hpp>

#include "../../comm/ucx/scratch_dir.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kRanks = 8, kRanksPerMachine = 2;

int64_t wall_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Rank `rank`'s ring: seq 1..last_seq of one all-reduce communicator, the
// last one in flight when in_flight. Its host is its machine.
void write_ring(const std::string& dir, int rank, uint64_t last_seq, bool in_flight, int64_t t0) {
  ballast_trace_header h{};
  h.magic = BALLAST_TRACE_MAGIC;
  h.version = BALLAST_TRACE_VERSION;
  h.header_size = sizeof h;
  h.slot_size = sizeof(ballast_trace_slot);
  h.slot_count = 16;
  h.pid = 4000000 + rank;  // not a process of this host: its state is not probed
  h.rank = rank;
  h.nranks = kRanks;
  h.clock_wall_ns = t0;
  h.clock_tick = 0;
  h.ns_per_tick = 1.0;
  h.head = last_seq;
  std::snprintf(h.host, sizeof h.host, "m%d", rank / kRanksPerMachine);
  std::vector<ballast_trace_slot> slots(16);
  for (uint64_t i = 0; i < last_seq; ++i) {
    ballast_trace_slot& s = slots[i];
    s.gen = i + 1;
    s.comm_id = 0xfeed;
    s.seq = i + 1;
    s.count = 1 << 20;
    s.bytes = 4 << 20;
    s.op = BALLAST_OP_ALLREDUCE;
    s.rank = s.world_rank = rank;
    s.nranks = kRanks;
    s.peer = s.wait_peer = s.send_peer = -1;
    s.issue_tick = s.start_tick = i * 1000000000ULL;  // a step a second
    const bool last = i + 1 == last_seq;
    s.state = last && in_flight ? BALLAST_TRACE_STARTED : BALLAST_TRACE_DONE;
    s.end_tick = s.state == BALLAST_TRACE_DONE ? s.start_tick + 300000000ULL : 0;
  }
  const std::string path = dir + "/rank-" + std::to_string(rank) + "." + std::to_string(h.pid) + ".nccl.btrace";
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&h), sizeof h);
  f.write(reinterpret_cast<const char*>(slots.data()), std::streamsize(slots.size() * sizeof(ballast_trace_slot)));
}

struct Seen {
  std::mutex mu;
  std::vector<nlohmann::json> rankings;
};

int on_ranking(void* user, const ballast_event* ev) {
  auto* seen = static_cast<Seen*>(user);
  if (ev->schema != BALLAST_SCHEMA_JSON) return 0;
  std::lock_guard<std::mutex> lock(seen->mu);
  seen->rankings.push_back(nlohmann::json::parse(std::string(static_cast<const char*>(ev->payload), ev->payload_size)));
  return 0;
}

// The machine detector's suspicion of m1, as its plugin publishes it: an
// outlier of z 8 against its threshold 3.5 (confidence min(1, z / 7)).
void suspect_m1(ballast_host* host) {
  ballast_fault_report r{};
  r.size = sizeof r;
  r.stage = BALLAST_FAULT_SUSPECTED;
  r.subject = "m1";
  r.rank = -1;
  r.kind = "outlier";
  r.metric = "gpu0.util";
  r.score = 8;
  r.confidence = 1;
  r.since_ns = r.detected_ns = wall_ns();
  r.detector = "machine";
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_FAULT_REPORT;
  ev.topic = "fault.suspected";
  ev.source = {"m1", -1, nullptr};
  ev.payload = &r;
  ev.payload_size = sizeof r;
  REQUIRE(ballast_host_publish(host, &ev) == BALLAST_OK);
}

}  // namespace

TEST_CASE("a rank hung outside the all-reduce: the fused ranking names its machine first") {
  test::ScratchDir scratch;
  const std::string dir = scratch.path() + "/rings";
  std::filesystem::create_directories(dir);
  const int64_t t0 = wall_ns() - 20000000000LL;  // the job started 20 s ago
  for (int r = 0; r < kRanks; ++r) write_ring(dir, r, r == 5 ? 5 : 6, r != 5, t0);

  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("controller", &host) == BALLAST_OK);
  const std::string hang_config = "{ trace_dir = '" + dir + "', stall_seconds = 0.5, period_seconds = 0.05 }";
  REQUIRE_MESSAGE(
      ballast_host_load_plugin(host, BALLAST_PLUGIN_DIR "/ballast-hang.so", hang_config.c_str()) == BALLAST_OK,
      ballast_last_error());
  REQUIRE(ballast_host_load_plugin(host, BALLAST_PLUGIN_DIR "/ballast-fusion.so", "{}") == BALLAST_OK);
  Seen seen;
  uint64_t id = 0;
  REQUIRE(ballast_host_subscribe(host, "suspects.ranking", nullptr, on_ranking, &seen, &id) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);
  suspect_m1(host);
  // The hang plugin publishes once the rings made no progress for 0.5 s.
  bool hang_seen = false;
  for (int i = 0; i < 600 && !hang_seen; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::lock_guard<std::mutex> lock(seen.mu);
    for (const auto& s : seen.rankings.empty() ? nlohmann::json::array() : seen.rankings.back()["suspects"])
      for (const auto& e : s["evidence"]) hang_seen |= e["detector"] == "hang";
  }
  ballast_host_destroy(host);
  REQUIRE(hang_seen);
  const auto& last = seen.rankings.back()["suspects"];
  REQUIRE(last.size() == 2);
  CHECK(last[0]["node"] == "m2");
  CHECK(last[0]["alerting"] == true);
  REQUIRE(last[0]["evidence"].size() == 1);
  CHECK(last[0]["evidence"][0]["detector"] == "hang");
  CHECK(last[0]["evidence"][0]["subject"] == "rank:5");
  CHECK(last[0]["evidence"][0]["kind"] == "not_joined");
  CHECK(last[1]["node"] == "m1");
  CHECK(last[1]["score"].get<double>() < last[0]["score"].get<double>());
}
