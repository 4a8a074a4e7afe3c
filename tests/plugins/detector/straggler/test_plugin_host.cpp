// The plugin in the real host, through the public C API (host.h): loaded
// with its configuration, fed the ST trace as step.timing events on the
// real bus (queued delivery), its straggler.report events received.
#include <doctest/doctest.h>

#include <ballast/host.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data.hpp"
#include "trace.hpp"

using namespace ballast::straggler;

namespace {

struct Received {
  std::mutex mu;
  std::vector<std::string> kinds;
  std::vector<std::string> first_culprits;
  std::vector<double> slowdowns;

  static int handler(void* user, const ballast_event* ev) {
    auto* self = static_cast<Received*>(user);
    if (ev->schema != BALLAST_SCHEMA_STRAGGLER_REPORT) return BALLAST_EINVAL;
    const auto* r = static_cast<const ballast_straggler_report*>(ev->payload);
    std::lock_guard lock(self->mu);
    self->kinds.push_back(r->kind);
    self->slowdowns.push_back(r->slowdown);
    self->first_culprits.push_back(r->count ? std::string(r->culprits[0].dimension) + " " + r->culprits[0].name : "");
    return BALLAST_OK;
  }
  size_t count() {
    std::lock_guard lock(mu);
    return kinds.size();
  }
};

}  // namespace

TEST_CASE("in the real host, ST's step.timing events give stage-imbalance reports") {
  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("straggler-test", &host) == BALLAST_OK);
  std::string plugin = std::string(BALLAST_PLUGIN_DIR) + "/ballast-straggler.so";
  REQUIRE_MESSAGE(
      ballast_host_load_plugin(host, plugin.c_str(), "{ window_steps = 16, report_every = 8 }") == BALLAST_OK,
      ballast_last_error());
  Received received;
  uint64_t id = 0;
  REQUIRE(ballast_host_subscribe(host, "straggler.report", nullptr, &Received::handler, &received, &id) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);

  // One batch per rank and step, in step order, as the ranks would publish.
  Trace st = read_trace(straggler_test::data("ST", "trace.csv.gz"));
  std::map<int64_t, std::map<int32_t, std::vector<ballast_op_timing>>> batches;
  for (const TraceRow& r : st.rows) {
    batches[r.step][r.rank].push_back({r.dp_rank, r.stage, r.rank, r.step, optype_name(r.optype).data(), r.start,
                                       r.duration, r.seq_id, r.mc, r.mb_id, r.gmc});
  }
  for (auto& [step, ranks] : batches) {
    for (auto& [rank, ops] : ranks) {
      ballast_op_timing_batch batch{sizeof batch, static_cast<uint32_t>(ops.size()), ops.data()};
      ballast_event ev{};
      ev.size = sizeof ev;
      ev.schema = BALLAST_SCHEMA_OP_TIMING_BATCH;
      ev.topic = "step.timing";
      ev.source.rank = rank;
      ev.payload = &batch;
      ev.payload_size = sizeof batch;
      REQUIRE(ballast_host_publish(host, &ev) == BALLAST_OK);
    }
  }
  // 31 completed steps: a report after 8, 16 and 24. Queued delivery: wait
  // (bounded) for the plugin to get through the events.
  for (int i = 0; i < 6000 && received.count() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(received.count() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(received.kinds[i] == "stage");
    CHECK(received.first_culprits[i] == "stage 3");
    CHECK(received.slowdowns[i] == doctest::Approx(1.179).epsilon(0.03));
  }
  int64_t reports = 0;
  CHECK(ballast_host_counter(host, "straggler.reports", &reports) == BALLAST_OK);
  CHECK(reports == 3);
  ballast_host_destroy(host);
}
