// Heartbeat files: the progress of ranks that write no trace ring (a
// PyTorch job on gloo or NCCL without Ballast's comm plugins), from
// "<dir>/rank-R.PID.heartbeat" (the format: README.md, "Heartbeats"), and
// the hang verdict from them and from each process's state in /proc.
#pragma once

#include "analysis.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ballast::hang {

struct Heartbeat {
  std::string path;
  int rank = -1, world = 0;
  int32_t pid = 0;
  std::string host;                      // the writer's machine
  uint64_t beat = 0;                     // progress marks so far
  int64_t step = 0;                      // the step in progress
  std::string phase;                     // what it does, "-" between phases
  bool comm = false;                     // the phase is a collective the other ranks take part in
  int64_t wall_ns = 0;                   // CLOCK_REALTIME of the last beat
  int stack_signal = 0;                  // the signal that dumps its Python stacks (0: none)
  bool done = false;                     // the process finished its work
  bool failed = false;                   // the process ended on an error of its own
  ProcState state = ProcState::unknown;  // of the process, on this host
};

constexpr size_t kHeartbeatSize = 512;

// FNV-1a 32 of `n` bytes: the checksum at the end of a heartbeat line.
uint32_t fnv1a32(const char* data, size_t n);

// Parse one heartbeat line (kHeartbeatSize bytes). false with *err naming
// the field when it is not one (a torn update among them: read again).
bool parse_heartbeat(const std::string& text, Heartbeat* out, std::string* err);

// Every *.heartbeat of dir, the newest process of each rank (highest
// wall_ns); unreadable files in *errors. Each one's process state probed.
std::vector<Heartbeat> read_heartbeats(const std::string& dir, std::vector<std::string>* errors);

// Changes whenever a rank beats.
uint64_t heartbeat_signature(const std::vector<Heartbeat>& beats);
// True when some rank started training (beat) and has not finished.
bool heartbeats_running(const std::vector<Heartbeat>& beats);

// Which rank stopped making progress, after Mycroft's order: a process
// gone (crashed) or stopped (stuck); a rank behind the others' step; a rank
// outside the collective the others wait in (not_joined, busy or sleeping);
// else the rank whose last beat is oldest (slow). `states` overrides the
// probed process state by rank (the launcher's record of what it saw
// before it stopped the job). Takes 100 ms to sample the CPU time of live
// ranks.
Verdict analyze_heartbeats(const std::vector<Heartbeat>& beats, const std::map<int, ProcState>& states = {});

// Each live, not stopped rank's Python stacks: its stack_signal is sent,
// and its "rank-R.PID.stack" read back once it stops growing (at most
// `wait_ms`); by rank. Ranks without a stack signal, stopped or gone get a
// sentence saying why there is none.
std::map<int, std::string> collect_stacks(const std::string& dir, const std::vector<Heartbeat>& beats, int wait_ms);

}  // namespace ballast::hang
