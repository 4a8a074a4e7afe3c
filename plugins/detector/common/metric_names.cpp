#include "metric_names.hpp"

#include <cmath>
#include <tuple>

namespace ballast::detector_names {

namespace {

// One rule: an exporter's metric name, the detector's name as a template
// (`{label}` is the label's value, `{label|x}` the same with x when the label
// is missing), whether it is cumulative, the scale to the detector's unit and
// how several series are combined. Documented in README.md: keep both alike.
struct Rule {
  const char* exporter;
  const char* detector;
  bool counter;
  double scale;
  bool mean;
};

constexpr double kMiB = 1048576;

const Rule kRules[] = {
    // DCGM exporter (NVIDIA), label gpu = the device index.
    {"DCGM_FI_DEV_GPU_UTIL", "gpu{gpu}.util", false, 1, false},
    {"DCGM_FI_DEV_MEM_COPY_UTIL", "gpu{gpu}.mem_util", false, 1, false},
    {"DCGM_FI_DEV_POWER_USAGE", "gpu{gpu}.power", false, 1, false},
    {"DCGM_FI_DEV_SM_CLOCK", "gpu{gpu}.sm_clock", false, 1, false},
    {"DCGM_FI_DEV_MEM_CLOCK", "gpu{gpu}.mem_clock", false, 1, false},
    {"DCGM_FI_DEV_GPU_TEMP", "gpu{gpu}.temp", false, 1, false},
    {"DCGM_FI_DEV_FB_USED", "gpu{gpu}.mem_used_bytes", false, kMiB, false},
    {"DCGM_FI_DEV_XID_ERRORS", "gpu{gpu}.xid", false, 1, false},
    {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gpu{gpu}.ecc.uncorrected", true, 1, false},
    {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "gpu{gpu}.ecc.corrected", true, 1, false},
    {"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "gpu{gpu}.pcie.tx_bytes", false, 1024, false},
    {"DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "gpu{gpu}.pcie.rx_bytes", false, 1024, false},
    {"DCGM_FI_PROF_PCIE_TX_BYTES", "gpu{gpu}.pcie.tx_bytes", false, 1, false},
    {"DCGM_FI_PROF_PCIE_RX_BYTES", "gpu{gpu}.pcie.rx_bytes", false, 1, false},
    {"DCGM_FI_PROF_NVLINK_TX_BYTES", "gpu{gpu}.nvlink.tx_bytes", false, 1, false},
    {"DCGM_FI_PROF_NVLINK_RX_BYTES", "gpu{gpu}.nvlink.rx_bytes", false, 1, false},
    {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "gpu{gpu}.nvlink.bytes", true, 1, false},
    // node-exporter.
    {"node_cpu_seconds_total", "cpu.{mode}", true, 100, true},
    {"node_context_switches_total", "ctxt", true, 1, false},
    {"node_load1", "load.1", false, 1, false},
    {"node_memory_MemTotal_bytes", "mem.total_bytes", false, 1, false},
    {"node_memory_MemAvailable_bytes", "mem.available_bytes", false, 1, false},
    {"node_pressure_cpu_waiting_seconds_total", "psi.cpu", true, 1, false},
    {"node_pressure_memory_waiting_seconds_total", "psi.memory", true, 1, false},
    {"node_pressure_io_waiting_seconds_total", "psi.io", true, 1, false},
    {"node_network_receive_bytes_total", "net.{device|all}.rx_bytes", true, 1, false},
    {"node_network_transmit_bytes_total", "net.{device|all}.tx_bytes", true, 1, false},
    {"node_network_receive_packets_total", "net.{device|all}.rx_packets", true, 1, false},
    {"node_network_transmit_packets_total", "net.{device|all}.tx_packets", true, 1, false},
    {"node_network_receive_errs_total", "net.{device|all}.rx_errors", true, 1, false},
    {"node_network_transmit_errs_total", "net.{device|all}.tx_errors", true, 1, false},
    {"node_network_receive_drop_total", "net.{device|all}.rx_drops", true, 1, false},
    {"node_network_transmit_drop_total", "net.{device|all}.tx_drops", true, 1, false},
    {"node_network_carrier_changes_total", "net.{device|all}.carrier_changes", true, 1, false},
    {"node_ethtool_rx_pause_ctrl_phy", "net.{device|all}.rx_pause", true, 1, false},
    {"node_ethtool_tx_pause_ctrl_phy", "net.{device|all}.tx_pause", true, 1, false},
    {"node_infiniband_port_data_received_bytes_total", "net.{device|ib}.rx_bytes", true, 1, false},
    {"node_infiniband_port_data_transmitted_bytes_total", "net.{device|ib}.tx_bytes", true, 1, false},
    {"node_netstat_Tcp_RetransSegs", "net.tcp.retrans", true, 1, false},
    {"node_netstat_Tcp_OutSegs", "net.tcp.out_segs", true, 1, false},
    {"node_disk_read_bytes_total", "disk.{device|all}.read_bytes", true, 1, false},
    {"node_disk_written_bytes_total", "disk.{device|all}.write_bytes", true, 1, false},
    {"node_disk_reads_completed_total", "disk.{device|all}.read_ops", true, 1, false},
    {"node_disk_writes_completed_total", "disk.{device|all}.write_ops", true, 1, false},
    {"node_disk_io_time_seconds_total", "disk.{device|all}.busy", true, 1, false},
    // Plain names, as dashboards and home-made exporters write them.
    {"gpu_util", "gpu{gpu}.util", false, 1, false},
    {"gpu_utilization", "gpu{gpu}.util", false, 1, false},
    {"gpu_power", "gpu{gpu}.power", false, 1, false},
    {"gpu_power_watts", "gpu{gpu}.power", false, 1, false},
    {"gpu_sm_clock", "gpu{gpu}.sm_clock", false, 1, false},
    {"gpu_mem_used_bytes", "gpu{gpu}.mem_used_bytes", false, 1, false},
    {"cpu_util", "cpu.util", false, 1, false},
    {"cpu_usage", "cpu.util", false, 1, false},
    {"mem_used_bytes", "mem.used_bytes", false, 1, false},
    {"mem_available_bytes", "mem.available_bytes", false, 1, false},
    {"net_tx_gbps", "net.{device|all}.tx_bytes", false, 1.25e8, false},
    {"net_rx_gbps", "net.{device|all}.rx_bytes", false, 1.25e8, false},
    {"net_tx_bytes", "net.{device|all}.tx_bytes", false, 1, false},
    {"net_rx_bytes", "net.{device|all}.rx_bytes", false, 1, false},
    {"tcp_retrans", "net.tcp.retrans", false, 1, false},
};

const std::string* label(const Labels& labels, std::string_view key) {
  for (const auto& [k, v] : labels)
    if (k == key) return &v;
  return nullptr;
}

// A label value inside a metric name: dots and braces would change the
// name's structure, so they become '_'.
void append_value(std::string* out, const std::string& v) {
  for (char c : v) *out += (c == '.' || c == '{' || c == '}' || c == ',' || c == '"') ? '_' : c;
}

bool fill(std::string_view tmpl, const Labels& labels, std::string* out) {
  out->clear();
  for (size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] != '{') {
      *out += tmpl[i];
      continue;
    }
    size_t end = tmpl.find('}', i);
    std::string_view spec = tmpl.substr(i + 1, end - i - 1);
    size_t bar = spec.find('|');
    const std::string* v = label(labels, spec.substr(0, bar));
    if (v && !v->empty())
      append_value(out, *v);
    else if (bar != std::string_view::npos)
      *out += spec.substr(bar + 1);
    i = end;
  }
  return true;
}

}  // namespace

bool map_series(std::string_view name, const Labels& labels, Mapping* out) {
  for (const Rule& r : kRules) {
    if (name != r.exporter) continue;
    fill(r.detector, labels, &out->name);
    out->counter = r.counter;
    out->scale = r.scale;
    out->mean = r.mean;
    return true;
  }
  return false;
}

bool parse_series(std::string_view t, std::string* name, Labels* labels) {
  labels->clear();
  size_t brace = t.find('{');
  if (brace == std::string_view::npos || brace == 0 || t.back() != '}') return false;
  *name = std::string(t.substr(0, brace));
  size_t i = brace + 1, end = t.size() - 1;
  while (i < end) {
    size_t eq = t.find('=', i);
    if (eq == std::string_view::npos || eq >= end || eq + 1 >= end || t[eq + 1] != '"') return false;
    std::string key(t.substr(i, eq - i));
    std::string value;
    size_t j = eq + 2;
    for (;; ++j) {
      if (j >= end) return false;
      char c = t[j];
      if (c == '"') break;
      if (c == '\\' && j + 1 < end) {
        char e = t[++j];
        c = e == 'n' ? '\n' : e;
      }
      value += c;
    }
    labels->emplace_back(std::move(key), std::move(value));
    i = j + 1;
    if (i < end) {
      if (t[i] != ',') return false;
      ++i;
    }
  }
  return true;
}

const Normaliser::Known& Normaliser::known(std::string_view series, const std::string* name, const Labels* labels) {
  auto it = known_.find(std::string(series));
  if (it != known_.end()) return it->second;
  Known k{false, {}};
  std::string parsed_name;
  Labels parsed_labels;
  if (!name) {
    if (!parse_series(series, &parsed_name, &parsed_labels)) parsed_name = std::string(series);
    name = &parsed_name;
    labels = &parsed_labels;
  }
  k.mapped = map_series(*name, *labels, &k.map);
  return known_.emplace(std::string(series), std::move(k)).first->second;
}

void Normaliser::record(std::string_view node, std::string_view series, const Mapping& m, int64_t ts_ns, double value) {
  if (!std::isfinite(value)) return;
  double v = value;
  if (m.counter) {
    std::string key = std::string(node) + '\n' + std::string(series);
    auto it = last_.find(key);
    if (it == last_.end()) {
      last_.emplace(std::move(key), Last{ts_ns, value, 0});
      return;
    }
    Last prev = it->second;
    int64_t dt = ts_ns - prev.ts_ns;
    it->second = Last{ts_ns, value, dt};
    if (dt <= 0 || value < prev.value) return;  // no interval, or a reset
    // After a lost reading the rate would span two intervals, which the
    // node's peers did not: that round is skipped, not compared.
    if (prev.dt_ns > 0 && dt > prev.dt_ns + prev.dt_ns / 2) return;
    v = (value - prev.value) / (static_cast<double>(dt) / 1e9);
  }
  Sum& s = pending_[{std::string(node), m.name, ts_ns}];
  s.total += v * m.scale;
  ++s.n;
  s.mean = m.mean;
}

bool Normaliser::add(std::string_view node, std::string_view series, int64_t ts_ns, double value) {
  const Known& k = known(series, nullptr, nullptr);
  if (!k.mapped) return false;
  record(node, series, k.map, ts_ns, value);
  return true;
}

bool Normaliser::add(std::string_view node, std::string_view series, std::string_view name, const Labels& labels,
                     int64_t ts_ns, double value) {
  std::string n(name);
  const Known& k = known(series, &n, &labels);
  if (!k.mapped) return false;
  record(node, series, k.map, ts_ns, value);
  return true;
}

void Normaliser::flush(std::vector<Out>* out) {
  for (auto& [key, s] : pending_) {
    const auto& [node, metric, ts] = key;
    out->push_back(Out{node, metric, ts, s.mean ? s.total / s.n : s.total});
  }
  pending_.clear();
}

}  // namespace ballast::detector_names
