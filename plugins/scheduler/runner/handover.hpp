// What a leading controller's executor hands its successor of the job's
// report, inside the Slurm backend's snapshot record (slurm.snapshot's
// "report"): bounded whatever the job's length, never a figure per step.
#pragma once

#include "job_report.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ballast::runner {

// The seconds spent in the steps the job's lineage keeps (ETTR's
// numerator). This term's steps are kept one by one (a restart from a
// checkpoint drops those after it); what came before is one total, to the
// last step an earlier leader applied, and one total to each of the newest
// checkpoints, for a restart from one of them.
class Lineage {
 public:
  static constexpr size_t kCheckpoints = 16;
  // Rank 0 trained `step` in `seconds`. A step the carried total already
  // holds is not counted again.
  void add(int64_t step, double seconds);
  // A checkpoint of `step` was saved: the total to it is kept.
  void checkpoint(int64_t step);
  // Training goes back to the checkpoint of `step`: the steps after it are
  // lost. False when the total to it is not known (an earlier leader's
  // step, none of the carried checkpoints): then the steps up to it count 0.
  bool rewind(int64_t step);
  double seconds() const { return base_s_ + term_s_; }
  int64_t last_step() const { return steps_.empty() ? base_step_ : steps_.rbegin()->first; }
  // {"step", "seconds", "checkpoints": [[step, seconds], ...]}
  nlohmann::json to_json() const;
  // The carried form; false with *error naming the field.
  static bool from_json(const nlohmann::json& j, Lineage* out, std::string* error);

 private:
  int64_t base_step_ = -1;  // the steps up to it are in base_s_
  double base_s_ = 0;
  std::map<int64_t, double> steps_;  // this term's, after base_step_
  double term_s_ = 0;                // their sum
  std::map<int64_t, double> at_checkpoint_;
};

// The report's figures a successor carries on: the job's first start,
// the attempts so far, the first and last loss, the newest incidents and
// the lineage's kept seconds (a Lineage, kept apart: this term's steps are
// not copied).
struct Handover {
  static constexpr size_t kIncidents = 64;
  static constexpr size_t kMaxBytes = 256u << 10;  // of the JSON, within the action log's 1 MiB record
  int64_t start_ns = 0;                            // CLOCK_REALTIME
  int attempts = 0;
  bool have_loss = false;
  double loss_first = 0, loss_last = 0;
  std::vector<Incident> incidents;  // the newest, oldest first
  int64_t incidents_omitted = 0;    // older ones left out
};

// The JSON of h: its newest kIncidents incidents (the rest counted as
// omitted), long texts cut, fewer incidents while over kMaxBytes.
nlohmann::json handover_json(const Handover& h, const Lineage& kept);
// Read a handover; false with *error naming the field ("report.incidents[3].fault").
bool handover_from_json(const nlohmann::json& j, Handover* out, Lineage* kept, std::string* error);

}  // namespace ballast::runner
