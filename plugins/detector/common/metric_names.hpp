// Standard exporters' metric names mapped to the detector's metric names.
//
// The faulty-machine detector (plugins/detector/machine) knows metrics by the
// collector's names (`gpu0.util`, `net.eth0.tx_bytes`, `cpu.user`, ...): its
// priority list and unit floors are written for them. Exporters name the same
// measurements differently (DCGM exporter `DCGM_FI_DEV_GPU_UTIL{gpu="0"}`,
// node-exporter `node_network_transmit_bytes_total{device="eth0"}`, plain
// `gpu_util`, `net_tx_gbps`). This table is the one place that maps them; the
// Prometheus scraper (plugins/detector/collect) and `ballast detect` both use
// it. The full table is in README.md next to this file.
//
// A mapped series becomes one detector sample: counters are turned into
// per-second rates first, the value is scaled to the detector's unit, and
// several series of one node that map to the same name at the same instant
// are combined (summed, or averaged: node_cpu_seconds_total of every CPU gives
// one `cpu.user` in percent of the machine).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ballast::detector_names {

using Labels = std::vector<std::pair<std::string, std::string>>;

struct Mapping {
  std::string name;      // the detector's metric name
  bool counter = false;  // cumulative: turn into a per-second rate first
  double scale = 1;      // multiply the value (or rate) by this
  bool mean = false;     // combine several series by their mean, not their sum
};

// Map one exporter series (metric name and labels). False when no rule
// matches: the series keeps its own name.
bool map_series(std::string_view name, const Labels& labels, Mapping* out);

// Split a series text `name{k="v",...}` (Prometheus escapes \\ \" \n in
// values) into name and labels. False when the text is not of that form
// (then it is a plain name, e.g. the collector's own `proc.cpu`).
bool parse_series(std::string_view text, std::string* name, Labels* labels);

// One node's readings turned into detector samples. Feed every reading of a
// round with add(), then flush() once the round is complete. One owner; not
// thread-safe. State grows with the distinct series seen (bounded by the
// caller's own caps on series).
class Normaliser {
 public:
  struct Out {
    std::string node, metric;
    int64_t ts_ns;
    double value;
  };
  // One reading. Returns false when the series matches no rule (the caller
  // keeps it as it is). A mapped counter's first reading, or one going
  // backwards (a reset), gives nothing yet but still returns true.
  bool add(std::string_view node, std::string_view series, int64_t ts_ns, double value);
  // The same, for a series already split (the scraper's parser gives labels).
  bool add(std::string_view node, std::string_view series, std::string_view name, const Labels& labels, int64_t ts_ns,
           double value);
  // Append the combined samples gathered since the last flush, ordered by
  // node, metric and time.
  void flush(std::vector<Out>* out);

 private:
  struct Known {
    bool mapped;
    Mapping map;
  };
  struct Last {
    int64_t ts_ns;
    double value;
    int64_t dt_ns;  // the interval before it, 0 when unknown
  };
  struct Sum {
    double total = 0;
    int n = 0;
    bool mean = false;
  };
  const Known& known(std::string_view series, const std::string* name, const Labels* labels);
  void record(std::string_view node, std::string_view series, const Mapping& m, int64_t ts_ns, double value);

  std::unordered_map<std::string, Known> known_;  // by series text
  std::unordered_map<std::string, Last> last_;    // counters: by node + '\n' + series
  std::map<std::tuple<std::string, std::string, int64_t>, Sum> pending_;
};

}  // namespace ballast::detector_names
