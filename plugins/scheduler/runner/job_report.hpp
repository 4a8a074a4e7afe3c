// What `ballast run` says about a supervised job at its end: steps, loss,
// each incident from injection to resumed training, ETTR; as text, as JSON,
// and as a Chrome/Perfetto timeline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ballast::runner {

struct Incident {
  int id = 0;
  std::string fault;                 // the injection's spec, or what a detector found
  std::string origin;                // "--inject ...", "FILE:LINE", or "not injected"
  int64_t injected_ns = 0;           // 0: not injected
  int64_t detected_ns = 0;           // first report of it
  std::string detector, verdict;     // who reported it; kind and subject ("stuck rank:2")
  int64_t decided_ns = 0;            // first recovery.action for it
  std::vector<std::string> actions;  // "restart: ok", ...
  int64_t resumed_ns = 0;            // first step trained after the recovery
  int64_t step_at_fault = -1;        // the job's furthest step when it struck
  int64_t resumed_from = -1;         // the checkpoint's step the job went back to
  std::string outcome = "open";      // recovered, escalated, stopped, open, handed over (its leader ended first)
  std::string message;               // the trainer's message (user-code error), the escalation's reason
  int64_t steps_lost() const {
    return resumed_from >= 0 && step_at_fault > resumed_from ? step_at_fault - resumed_from : 0;
  }
};

struct Span {
  std::string track;  // "job", "steps", "actions", "faults"
  std::string name;
  int64_t start_ns = 0, end_ns = 0;  // end == start: an instant
  nlohmann::json args = nlohmann::json::object();
};

struct Summary {
  std::string command;
  int ranks = 0;
  std::string state;  // finished, escalated, stopped, interrupted, failed
  std::string reason;
  int64_t start_ns = 0, end_ns = 0;
  int attempts = 0;
  int64_t steps = 0;  // the furthest step trained and kept
  bool have_loss = false;
  double loss_first = 0, loss_last = 0;
  double kept_seconds = 0;  // time spent in the steps the final weights hold
  std::vector<Incident> incidents;
  int64_t incidents_omitted = 0;  // older ones an earlier leader's snapshot left out
  // The figures include earlier leaders' terms (carried in their Slurm
  // snapshot); the spans are this executor's only.
  bool earlier_leaders = false;
  std::vector<Span> spans;
  double wall_seconds() const { return double(end_ns - start_ns) / 1e9; }
  double ettr() const { return wall_seconds() > 0 ? kept_seconds / wall_seconds() : 0; }
};

nlohmann::json summary_json(const Summary& s);
std::string summary_text(const Summary& s);
// Chrome trace event format ({"traceEvents": [...]}), for chrome://tracing
// and ui.perfetto.dev: one process, a thread per track.
nlohmann::json timeline_json(const Summary& s);

}  // namespace ballast::runner
