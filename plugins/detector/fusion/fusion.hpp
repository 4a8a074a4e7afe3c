// One ranked list of suspects per job, fused from every detector's
// suspicions: the machine detector (fault.suspected, node.silent), the hang
// analysis (fault.confirmed, per rank) and the straggler analysis
// (straggler.report, culprit ranks). A policy decides on one list instead of
// three streams.
//
// Each piece of evidence has a weight in [0, 1]: a fault report's
// confidence (x `suspected_weight` while only suspected), a straggler
// culprit's share of the slowdown (x `straggler_weight`); weights halve
// every `half_life` seconds without a new report. Per suspect, each
// detector's strongest current weight counts, and the detectors combine as
// independent witnesses: score = 1 - prod(1 - w). A suspect is "alerting"
// at score >= `min_score`. Ranks are folded into their node through the
// last placement.plan, else the machine the reporter named as the event's
// source (the hang analysis: the host of the rank's trace ring), else
// `ranks_per_node` names "rank-group:K", else the suspect stays "rank:N".
//
// Not thread-safe: one owner (the plugin serialises with a mutex).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ballast::fusion {

struct FusionConfig {
  double half_life_s = 120;
  double min_score = 0.5;
  double suspected_weight = 0.7;
  double straggler_weight = 0.6;
  int ranks_per_node = 0;      // 0: only a placement.plan maps ranks to nodes
  size_t max_suspects = 1024;  // distinct subjects kept; the weakest go first
};

struct Suspicion {
  std::string detector;  // "machine", "hang", "straggler", ...
  std::string subject;   // node name, or "rank:N"
  int32_t rank = -1;
  std::string node;  // a rank's machine as the reporter knew it (the event's source.node), or ""
  std::string kind, metric;
  double score = 0, confidence = 0;
  bool confirmed = false;
  int64_t since_ns = 0, at_ns = 0;
  std::string evidence;  // the detector's JSON text, or ""
};

struct Evidence {
  Suspicion from;
  double weight = 0;  // at the time of the ranking
};

struct Suspect {
  std::string node;
  double score = 0;
  bool alerting = false;
  int64_t since_ns = 0;            // earliest evidence
  std::vector<Evidence> evidence;  // one per detector, strongest first
};

class Fusion {
 public:
  explicit Fusion(FusionConfig config) : config_(config) {}

  void add(Suspicion s);
  // A straggler.report's culprits of dimension "rank" (name = the rank).
  // Only a report of kind "worker" (fixing its few slowest ranks removes
  // most of the slowdown) is evidence against a rank: under "random" or
  // "stage" the named ranks are merely the slowest of many alike (a
  // job-wide all-reduce slowdown gives every rank the job's whole slowdown).
  void add_straggler(int32_t rank, const std::string& kind, double culprit_slowdown, double job_slowdown, int64_t at_ns,
                     const std::string& evidence);
  // A placement.plan: node i holds the ranks from its first_rank on.
  void set_placement(std::vector<std::pair<std::string, int32_t>> node_first_rank);

  // Suspects by score (highest first; ties: earliest since), at now_ns.
  std::vector<Suspect> ranking(int64_t now_ns) const;
  const FusionConfig& config() const { return config_; }

 private:
  std::string node_of(const Suspicion& s) const;
  double weight(const Suspicion& s, int64_t now_ns) const;

  FusionConfig config_;
  std::vector<std::pair<int32_t, std::string>> placement_;  // first_rank -> node, sorted
  // node -> detector -> its strongest evidence
  std::map<std::string, std::map<std::string, Suspicion>> by_node_;
};

}  // namespace ballast::fusion
