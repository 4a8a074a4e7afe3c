// The job channel (docs/job-channel.md): the Unix datagram socket the ranks
// report to, and the append-only control file the executor writes commands
// to. Owned by the executor's supervising thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ballast::runner {

struct OpReport {
  std::string optype;
  double start_s = 0, duration_s = 0;
};

// One report of a rank, parsed. Fields a type does not carry keep their
// defaults.
struct Report {
  std::string type;  // hello, step, checkpoint, error, done
  int rank = -1;
  int64_t step = -1;
  int pid = 0, attempt = 0;
  double loss = 0;
  bool loss_finite = true;
  double start_s = 0, duration_s = 0, seconds = 0;
  uint64_t bytes = 0;
  std::string path, kind, message;
  std::vector<OpReport> ops;
};

// Parse one datagram. std::nullopt with *error naming the field when it is
// not a report of the channel. world: ranks must be in [0, world).
std::optional<Report> parse_report(const std::string& datagram, int world, std::string* error);

class ReportSocket {
 public:
  ReportSocket() = default;
  ~ReportSocket();
  ReportSocket(const ReportSocket&) = delete;
  ReportSocket& operator=(const ReportSocket&) = delete;
  // Bind a datagram socket at path (removed first if a socket is there).
  bool open(const std::string& path, std::string* error);
  // Whether a process has a datagram socket bound at path (connect()
  // succeeds): another executor's channel, not a file left by a dead one.
  static bool answers(const std::string& path);
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Every datagram waiting now, without blocking.
  std::vector<std::string> drain();
  void close();

 private:
  int fd_ = -1;
  std::string path_;
  ino_t inode_ = 0;  // of the socket file bound at path_
};

// The control file: whole JSON lines, appended, each with a new seq.
class ControlFile {
 public:
  // Created empty; or kept (keep: the commands there stay, and seq goes on from them).
  bool open(const std::string& path, bool keep, std::string* error);
  const std::string& path() const { return path_; }
  // Append {"seq", "command", "rank" (-1 = all), extra fields...}.
  bool send(const std::string& command, int rank, const std::string& extra_json_fields, std::string* error);
  uint64_t last_seq() const { return seq_; }

 private:
  std::string path_;
  uint64_t seq_ = 0;
};

}  // namespace ballast::runner
