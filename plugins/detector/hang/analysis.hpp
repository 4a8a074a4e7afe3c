// Root cause of a hung, failed, mismatched or slow collective, from the
// trace rings of every rank (after Mycroft: first the ranks that never
// entered the collective the others wait in, then the rank whose progress
// stopped first; the state of each process tells crashed from stuck).
#pragma once

#include "rings.hpp"

#include <string>
#include <vector>

namespace ballast::hang {

struct Cause {
  int rank = -1;         // global rank
  std::string kind;      // crashed, stuck, not_joined, slow, mismatch
  std::string evidence;  // one sentence
  int peer = -1;         // global rank at the other end of a stalled link (kind slow), else -1
};

struct Verdict {
  std::string verdict = "healthy";  // healthy, hang, mismatch, slow
  uint64_t comm_id = 0;
  uint64_t seq = 0;
  std::string op;
  int ranks = 0;                 // rings read
  int64_t last_progress_ns = 0;  // wall clock of the last progress in the communicator concerned
  std::vector<Cause> causes;
  std::vector<std::string> warnings;  // unreadable files, overflow
  std::string to_json() const;
  std::string to_text() const;
};

struct Options {
  double slow_ms = 1000;  // a rank entering collectives this much later than the others is slow
};

// Takes 100 ms more when live ranks of this host lag: their CPU time is
// sampled over that window (activity()) for the evidence.
Verdict analyze(const std::vector<RankRing>& rings, const Options& opt);

// True when some rank has an operation in flight (started, not finished).
bool in_flight(const std::vector<RankRing>& rings);
// True when some rank recorded a failed operation.
bool any_failed(const std::vector<RankRing>& rings);
// Changes whenever any rank makes progress.
uint64_t progress_signature(const std::vector<RankRing>& rings);
// Wall clock of the latest progress any rank recorded (an operation issued,
// started, advanced or ended); 0 when there is none.
int64_t last_progress_ns(const std::vector<RankRing>& rings);

// Chrome/Perfetto trace-event JSON of every record: one process per rank
// (pid = the rank), one thread per communicator (tid = 1, 2, ... in the
// order of the communicator ids), named by "M" metadata events.
std::string chrome_trace(const std::vector<RankRing>& rings);

}  // namespace ballast::hang
