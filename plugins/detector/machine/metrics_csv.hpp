// Reading a metrics CSV for `ballast detect`: a header naming the columns
// ts,node,metric,value (any order, other columns ignored), then one sample
// per line: ts in seconds (any epoch), node and metric names (valid UTF-8;
// RFC 4180 quoting, so that a labelled series `name{a="x",b="y"}` is one
// field: `"name{a=""x"",b=""y""}"`), a finite value. Plain or
// gzip-compressed (by content).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ballast::machine {

struct MetricRow {
  int64_t ts_ns;
  uint32_t node;    // index into MetricsTable::nodes
  uint32_t metric;  // index into MetricsTable::metrics
  double value;
};

struct MetricsTable {
  std::vector<std::string> nodes, metrics;
  std::vector<MetricRow> rows;  // file order; per node, time never goes backwards
};

// Read `path`. On bad input returns false with *error as
// "FILE:LINE: column N (NAME): what" (or "FILE:LINE: what" for whole-line
// problems, "FILE: what" for the file itself).
bool read_metrics_csv(const std::string& path, MetricsTable* out, std::string* error);

}  // namespace ballast::machine
