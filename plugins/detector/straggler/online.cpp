#include "online.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

namespace ballast::straggler {

std::optional<OpType> timer_optype(std::string_view name) {
  if (auto t = parse_optype(name)) return t;
  struct Alias {
    std::string_view word;
    OpType type;
  };
  static constexpr Alias kAliases[] = {
      {"forward", OpType::forward_compute},
      {"backward", OpType::backward_compute},
      {"allreduce", OpType::separate_grads_all_reduce},
      {"all-reduce", OpType::separate_grads_all_reduce},
      {"grad-sync", OpType::separate_grads_all_reduce},
      {"optimizer-step", OpType::optimizer},
      {"optim", OpType::optimizer},
  };
  for (const auto& a : kAliases)
    if (a.word == name) return a.type;
  return std::nullopt;
}

OnlineDetector::OnlineDetector(OnlineConfig config) : config_(std::move(config)) {
  config_.window_steps = std::max<size_t>(config_.window_steps, 1);
  config_.report_every = std::max<size_t>(config_.report_every, 1);
}

void OnlineDetector::add(const ballast_op_timing* ops, size_t count) {
  std::set<int32_t> seen;  // ranks of this batch
  for (size_t i = 0; i < count; ++i) {
    const ballast_op_timing& o = ops[i];
    // A rank's first op of a batch for a step it already reported: the rank
    // restarted from a checkpoint and runs those steps again. Its rows from
    // there on are the old attempt's: dropped, and the window analysed again
    // from there.
    const bool first_of_rank = seen.insert(o.rank).second;
    if (const auto at = latest_.find(o.rank); first_of_rank && at != latest_.end() && o.step <= at->second) {
      for (auto it = steps_.lower_bound(o.step); it != steps_.end(); ++it)
        std::erase_if(it->second, [&](const TraceRow& r) { return r.rank == o.rank; });
      at->second = o.step - 1;
      last_analysed_ = std::min(last_analysed_, o.step - 1);
      ++counters_.restarts;
    }
    if (o.optype && std::strcmp(o.optype, "step") == 0) {
      ++counters_.step_rows;
      continue;
    }
    auto type = o.optype ? timer_optype(o.optype) : std::nullopt;
    if (!type || !std::isfinite(o.start_s) || !std::isfinite(o.duration_s) || o.duration_s < 0 || o.dp_rank < 0 ||
        o.stage < 0 || o.rank < 0 || o.seq_id < 0) {
      ++counters_.rejected;
      continue;
    }
    steps_[o.step].push_back(
        {o.dp_rank, o.stage, o.rank, o.step, *type, o.start_s, o.duration_s, o.seq_id, o.mc, o.mb_id, o.gmc});
    int64_t& latest = latest_[o.rank];
    latest = std::max(latest, o.step);
    ++counters_.ops;
  }
}

std::vector<int64_t> OnlineDetector::completed_steps() const {
  if (latest_.empty()) return {};
  int64_t newest = INT64_MIN;
  for (auto& [rank, step] : latest_) newest = std::max(newest, step);
  // A rank that fell a whole window behind has stopped reporting (another
  // detector's business): it no longer holds the others back.
  int64_t horizon = newest;
  for (auto& [rank, step] : latest_) {
    if (newest - step <= static_cast<int64_t>(config_.window_steps)) horizon = std::min(horizon, step);
  }
  std::vector<int64_t> done;
  for (auto& [step, rows] : steps_) {
    if (step < horizon) done.push_back(step);
  }
  return done;
}

std::optional<WhatIfResult> OnlineDetector::poll() {
  std::vector<int64_t> done = completed_steps();
  size_t fresh =
      static_cast<size_t>(std::count_if(done.begin(), done.end(), [&](int64_t s) { return s > last_analysed_; }));
  if (fresh < config_.report_every) return std::nullopt;

  // Forget what slid out of the window.
  if (done.size() > config_.window_steps) {
    int64_t oldest_kept = done[done.size() - config_.window_steps];
    steps_.erase(steps_.begin(), steps_.lower_bound(oldest_kept));
    done.erase(done.begin(), done.end() - static_cast<std::ptrdiff_t>(config_.window_steps));
  }
  last_analysed_ = done.back();

  Trace trace;
  trace.source = "step.timing events";
  for (int64_t s : done) {
    const auto& rows = steps_[s];
    trace.rows.insert(trace.rows.end(), rows.begin(), rows.end());
  }
  ++counters_.analyses;
  try {
    WhatIfOptions options;
    options.drop_bad_steps = true;
    WhatIfResult r = analyze(trace, config_.meta, options);
    last_error_.clear();
    if (r.slowdown < config_.min_slowdown) return std::nullopt;
    return r;
  } catch (const std::exception& e) {
    ++counters_.failures;
    last_error_ = e.what();
    return std::nullopt;
  }
}

}  // namespace ballast::straggler
