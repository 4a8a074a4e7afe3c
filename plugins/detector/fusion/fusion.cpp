#include "fusion.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace ballast::fusion {

void Fusion::set_placement(std::vector<std::pair<std::string, int32_t>> nodes) {
  placement_.clear();
  for (auto& [name, first] : nodes)
    if (first >= 0) placement_.emplace_back(first, std::move(name));
  std::sort(placement_.begin(), placement_.end());
}

std::string Fusion::node_of(const Suspicion& s) const {
  int32_t rank = s.rank;
  if (s.subject.rfind("rank:", 0) == 0)
    rank = std::atoi(s.subject.c_str() + 5);
  else if (!s.subject.empty())
    return s.subject;  // a node already
  if (rank < 0) return {};
  if (!placement_.empty()) {
    auto it = std::upper_bound(placement_.begin(), placement_.end(), rank,
                               [](int32_t r, const auto& p) { return r < p.first; });
    if (it != placement_.begin()) return (it - 1)->second;
  }
  if (!s.node.empty()) return s.node;
  if (config_.ranks_per_node > 0) return "rank-group:" + std::to_string(rank / config_.ranks_per_node);
  return "rank:" + std::to_string(rank);
}

double Fusion::weight(const Suspicion& s, int64_t now_ns) const {
  double w = s.confidence > 0 ? std::min(1.0, s.confidence) : 0.5;
  if (!s.confirmed) w *= s.detector == "straggler" ? config_.straggler_weight : config_.suspected_weight;
  double age = static_cast<double>(now_ns - s.at_ns) / 1e9;
  if (age > 0 && config_.half_life_s > 0) w *= std::exp2(-age / config_.half_life_s);
  return std::isfinite(w) ? std::clamp(w, 0.0, 1.0) : 0.0;
}

void Fusion::add(Suspicion s) {
  std::string node = node_of(s);
  if (node.empty()) return;
  auto& per = by_node_[node];
  auto it = per.find(s.detector);
  // The newer report replaces the older one unless the older one still weighs more.
  if (it != per.end() && weight(it->second, s.at_ns) > weight(s, s.at_ns)) {
    it->second.at_ns = std::max(it->second.at_ns, s.at_ns);
  } else {
    if (it != per.end() && it->second.since_ns > 0 && (s.since_ns == 0 || it->second.since_ns < s.since_ns))
      s.since_ns = it->second.since_ns;
    per[s.detector] = std::move(s);
  }
  if (by_node_.size() > config_.max_suspects) {
    // Input decides how many subjects appear: drop the weakest.
    int64_t now = 0;
    for (const auto& [n, p] : by_node_)
      for (const auto& [d, e] : p) now = std::max(now, e.at_ns);
    auto weakest = by_node_.end();
    double least = 2;
    for (auto i = by_node_.begin(); i != by_node_.end(); ++i) {
      double best = 0;
      for (const auto& [d, e] : i->second) best = std::max(best, weight(e, now));
      if (i->first != node && best < least) least = best, weakest = i;
    }
    if (weakest != by_node_.end()) by_node_.erase(weakest);
  }
}

void Fusion::add_straggler(int32_t rank, const std::string& kind, double culprit_slowdown, double job_slowdown,
                           int64_t at_ns, const std::string& evidence) {
  if (kind != "worker") return;
  Suspicion s;
  s.detector = "straggler";
  s.subject = "rank:" + std::to_string(rank);
  s.rank = rank;
  s.kind = "slow";
  s.score = culprit_slowdown;
  // The share of the job's slowdown this rank explains.
  double excess = job_slowdown - 1;
  s.confidence =
      excess > 0 && std::isfinite(culprit_slowdown) ? std::clamp((culprit_slowdown - 1) / excess, 0.0, 1.0) : 0;
  s.since_ns = s.at_ns = at_ns;
  s.evidence = evidence;
  if (s.confidence > 0) add(std::move(s));
}

std::vector<Suspect> Fusion::ranking(int64_t now_ns) const {
  std::vector<Suspect> out;
  for (const auto& [node, per] : by_node_) {
    Suspect s;
    s.node = node;
    double miss = 1;
    for (const auto& [d, e] : per) {
      double w = weight(e, now_ns);
      miss *= 1 - w;
      s.evidence.push_back({e, w});
      if (e.since_ns && (!s.since_ns || e.since_ns < s.since_ns)) s.since_ns = e.since_ns;
    }
    std::sort(s.evidence.begin(), s.evidence.end(),
              [](const Evidence& a, const Evidence& b) { return a.weight > b.weight; });
    s.score = 1 - miss;
    s.alerting = s.score >= config_.min_score;
    if (s.score > 1e-3) out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const Suspect& a, const Suspect& b) {
    if (a.score != b.score) return a.score > b.score;
    return a.since_ns < b.since_ns;
  });
  return out;
}

}  // namespace ballast::fusion
