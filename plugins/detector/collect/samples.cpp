#include "samples.hpp"

#include <ballast/events.h>

#include <cmath>

namespace ballast::collect {

void add_gauge(std::vector<Sample>* out, std::string metric, double value) {
  bool ok = std::isfinite(value);
  out->push_back(Sample{std::move(metric), ok ? value : 0.0, ok ? 0u : static_cast<uint32_t>(BALLAST_SAMPLE_INVALID)});
}

bool Rates::rate(const std::string& key, double value, int64_t ts_ns, double* rate, bool* reset) {
  *reset = false;
  auto it = last_.find(key);
  if (it == last_.end()) {
    last_.emplace(key, Last{value, ts_ns, gen_});
    return false;
  }
  Last& l = it->second;
  double dv = value - l.value;
  double dt = static_cast<double>(ts_ns - l.ts_ns) / 1e9;
  bool same_time = ts_ns <= l.ts_ns;
  l.gen = gen_;
  if (same_time) return false;  // no interval: keep the older reading
  l.value = value;
  l.ts_ns = ts_ns;
  if (!std::isfinite(dv) || dv < 0) {
    *reset = true;
    return false;
  }
  *rate = dv / dt;
  return true;
}

void Rates::add(std::vector<Sample>* out, const std::string& metric, double value, int64_t ts_ns, double scale,
                const std::string& key) {
  double r = 0;
  bool reset = false;
  if (rate(key.empty() ? metric : key, value, ts_ns, &r, &reset)) {
    out->push_back(Sample{metric, r * scale, BALLAST_SAMPLE_COUNTER});
  } else if (reset) {
    out->push_back(Sample{metric, 0.0, BALLAST_SAMPLE_COUNTER | BALLAST_SAMPLE_COUNTER_RESET});
  }
}

void Rates::sweep() {
  for (auto it = last_.begin(); it != last_.end();) {
    if (it->second.gen != gen_)
      it = last_.erase(it);
    else
      ++it;
  }
  ++gen_;
}

}  // namespace ballast::collect
