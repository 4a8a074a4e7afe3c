// The exporter name table shared by the scraper and `ballast detect`:
// names, labels, counters turned into rates, series combined.
#include <doctest/doctest.h>

#include "metric_names.hpp"

#include <string>
#include <vector>

using namespace ballast::detector_names;

namespace {

constexpr int64_t kSec = 1000000000;

std::vector<Normaliser::Out> flush(Normaliser& n) {
  std::vector<Normaliser::Out> out;
  n.flush(&out);
  return out;
}

}  // namespace

TEST_CASE("DCGM exporter, node-exporter and plain names map to the detector's") {
  Mapping m;
  REQUIRE(map_series("DCGM_FI_DEV_GPU_UTIL", {{"gpu", "3"}, {"UUID", "GPU-x"}}, &m));
  CHECK(m.name == "gpu3.util");
  CHECK_FALSE(m.counter);
  REQUIRE(map_series("DCGM_FI_DEV_FB_USED", {{"gpu", "0"}}, &m));
  CHECK(m.name == "gpu0.mem_used_bytes");
  CHECK(m.scale == 1048576);
  REQUIRE(map_series("node_network_transmit_bytes_total", {{"device", "eth0"}}, &m));
  CHECK(m.name == "net.eth0.tx_bytes");
  CHECK(m.counter);
  REQUIRE(map_series("node_network_transmit_bytes_total", {}, &m));
  CHECK(m.name == "net.all.tx_bytes");
  REQUIRE(map_series("node_cpu_seconds_total", {{"cpu", "7"}, {"mode", "user"}}, &m));
  CHECK(m.name == "cpu.user");
  CHECK(m.mean);
  REQUIRE(map_series("gpu_util", {}, &m));
  CHECK(m.name == "gpu.util");
  REQUIRE(map_series("net_tx_gbps", {}, &m));
  CHECK(m.name == "net.all.tx_bytes");
  CHECK(m.scale == 1.25e8);
  // A label value cannot change the name's structure.
  REQUIRE(map_series("node_network_receive_bytes_total", {{"device", "a.b{c}"}}, &m));
  CHECK(m.name == "net.a_b_c_.rx_bytes");
  CHECK_FALSE(map_series("proc.cpu", {}, &m));
  CHECK_FALSE(map_series("my_own_metric", {}, &m));
}

TEST_CASE("series text is split into name and labels, with escapes") {
  std::string name;
  Labels labels;
  REQUIRE(parse_series("node_cpu_seconds_total{cpu=\"0\",mode=\"idle\"}", &name, &labels));
  CHECK(name == "node_cpu_seconds_total");
  REQUIRE(labels.size() == 2);
  CHECK(labels[1] == std::make_pair(std::string("mode"), std::string("idle")));
  REQUIRE(parse_series("x{a=\"q\\\"uote,\\\\\"}", &name, &labels));
  CHECK(labels[0].second == "q\"uote,\\");
  CHECK_FALSE(parse_series("proc.cpu", &name, &labels));
  CHECK_FALSE(parse_series("x{a=1}", &name, &labels));
  CHECK_FALSE(parse_series("x{a=\"1\"", &name, &labels));
  CHECK_FALSE(parse_series("{a=\"1\"}", &name, &labels));
}

TEST_CASE("counters become rates; CPUs are averaged into percent; resets and gaps give nothing") {
  Normaliser n;
  // Two CPUs, user time: 0.5 s/s and 0.3 s/s -> cpu.user = 40%.
  for (int t = 0; t < 3; ++t) {
    CHECK(n.add("a", "node_cpu_seconds_total{cpu=\"0\",mode=\"user\"}", t * kSec, 100 + 0.5 * t));
    CHECK(n.add("a", "node_cpu_seconds_total{cpu=\"1\",mode=\"user\"}", t * kSec, 200 + 0.3 * t));
    CHECK(n.add("a", "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"}", t * kSec, 90));
  }
  CHECK_FALSE(n.add("a", "proc.cpu", 0, 1));  // not an exporter name: kept as it is
  auto out = flush(n);
  std::vector<double> cpu, gpu;
  for (const auto& o : out) (o.metric == "cpu.user" ? cpu : gpu).push_back(o.value);
  REQUIRE(cpu.size() == 2);  // the first reading of a counter gives no rate
  CHECK(cpu[0] == doctest::Approx(40));
  CHECK(cpu[1] == doctest::Approx(40));
  CHECK(gpu.size() == 3);
  // A counter going backwards (an exporter restart) gives nothing for that
  // interval; a lost reading (the next interval twice as long) neither.
  const char* tx = "node_network_transmit_bytes_total{device=\"ib0\"}";
  n.add("a", tx, 10 * kSec, 1000);
  n.add("a", tx, 11 * kSec, 2000);
  n.add("a", tx, 12 * kSec, 500);
  n.add("a", tx, 13 * kSec, 1500);
  n.add("a", tx, 15 * kSec, 9500);
  n.add("a", tx, 16 * kSec, 10500);
  out = flush(n);
  std::vector<std::pair<int64_t, double>> rates;
  for (const auto& o : out) rates.emplace_back(o.ts_ns / kSec, o.value);
  CHECK(rates == std::vector<std::pair<int64_t, double>>{{11, 1000}, {13, 1000}, {16, 1000}});
}
