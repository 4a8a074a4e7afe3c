// Prometheus's /api/v1/query_range over libcurl: one PromQL query over a
// time window, each series as (label value, [(ts, value)]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ballast::promquery {

struct Series {
  std::string node;                               // the value of the node label
  std::vector<std::pair<double, double>> points;  // unix seconds, value (NaN kept, flagged by the caller)
};

// GET url/api/v1/query_range?query=..&start=..&end=..&step=.. . False with
// *error naming the URL and Prometheus's error.
bool query_range(const std::string& url, const std::string& query, double start, double end, double step,
                 const std::string& node_label, std::vector<Series>* out, std::string* error, long timeout_ms = 5000);

}  // namespace ballast::promquery
