// The trainer's side of docs/job-channel.md: reports to the executor over a
// Unix datagram socket, commands from the append-only control file, and the
// faults BALLAST_INJECT asks the trainer to inject itself.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trainer {

class JobChannel {
 public:
  // socket_path / control_path empty: no reports / no commands (unsupervised).
  JobChannel(std::string socket_path, std::string control_path, int rank);
  ~JobChannel();
  JobChannel(const JobChannel&) = delete;
  JobChannel& operator=(const JobChannel&) = delete;

  bool supervised() const { return !socket_path_.empty(); }

  // Sends one report (its "type" and "rank" are added); a report that cannot
  // be sent is dropped, never fatal. Only a full receiving queue is waited on
  // (not for a step report): up to 1 s.
  void report(const char* type, nlohmann::json fields);

  struct Command {
    uint64_t seq = 0;
    std::string command;  // checkpoint_now, skip, slow, stop
    double factor = 1;    // slow's
  };
  // The complete lines appended since the last call (the first call: since
  // the channel was made, when the rank started) that are meant for this
  // rank. A line that is not a JSON object with a string "command" is
  // skipped with a message on stderr naming the file and its line.
  std::vector<Command> poll();

 private:
  std::string socket_path_, control_path_;
  int rank_;
  int fd_ = -1;
  uint64_t offset_ = 0;  // bytes of the control file consumed
  uint64_t line_ = 0;    // lines consumed, for messages
};

// BALLAST_INJECT: "nan@STEP,usererror@STEP,...". Throws naming the bad item.
struct Injections {
  std::set<uint64_t> nan, usererror;
};
Injections parse_injections(const std::string& spec);

// Wall-clock seconds (CLOCK_REALTIME), as reports carry them.
double wall_seconds();

}  // namespace trainer
