// `ballast detect`: replay a metrics CSV through the detector.
#pragma once

#include "detector.hpp"
#include "metrics_csv.hpp"

#include <vector>

namespace ballast::machine {

// Feed the rows in time order and evaluate once per sampling round: rows are
// grouped in periods of config.period_s, and the detector evaluates when a
// round is complete, at the time of its last sample (when a live detector
// would have had the same data). Empty periods are evaluated at their end,
// so silent machines are still noticed. Returns every alert.
std::vector<Alert> replay(const MetricsTable& table, Detector* detector);

// Exporter series (DCGM exporter, node-exporter, plain names) renamed to the
// detector's metrics through plugins/detector/common's table, counters
// turned into rates, series of one name combined. Other rows are kept.
struct NameCounts {
  size_t mapped_names = 0;  // distinct input metric names that were mapped
};
NameCounts map_exporter_names(MetricsTable* table);

// The command: `ballast detect --metrics FILE.csv[.gz] [--config FILE.lua] [--json]`.
// Exit 0 on success (alerts or not), 1 on bad input, 2 on a usage error.
int detect_main(int argc, char** argv);

}  // namespace ballast::machine
