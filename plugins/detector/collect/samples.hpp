// Samples as the collector produces them, and counters turned into rates.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace ballast::collect {

struct Sample {
  std::string metric;
  double value;
  uint32_t flags;  // enum ballast_sample_flags
};

// A gauge: NaN or infinite readings are flagged BALLAST_SAMPLE_INVALID.
void add_gauge(std::vector<Sample>* out, std::string metric, double value);

// Turns monotonic counters into per-second rates. The first reading of a key
// gives no sample; a counter that goes backwards gives a sample flagged
// BALLAST_SAMPLE_COUNTER_RESET (value 0, not data) and restarts from the new
// reading. Keys not read since the previous sweep() are forgotten.
// One owner; not thread-safe.
class Rates {
 public:
  // Adds `metric` = scale * d(value)/dt to *out, keyed by `key` (the metric
  // name unless a finer key is needed, e.g. per process).
  void add(std::vector<Sample>* out, const std::string& metric, double value, int64_t ts_ns, double scale = 1.0,
           const std::string& key = {});
  // The rate of `key` without emitting it; false on the first reading or a
  // reset (*reset tells which).
  bool rate(const std::string& key, double value, int64_t ts_ns, double* rate, bool* reset);
  void sweep();
  size_t size() const { return last_.size(); }

 private:
  struct Last {
    double value;
    int64_t ts_ns;
    uint64_t gen;
  };
  std::unordered_map<std::string, Last> last_;
  uint64_t gen_ = 1;
};

}  // namespace ballast::collect
