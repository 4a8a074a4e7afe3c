// The agent's spool: every event it forwards, journaled (core/journal) with
// its per-node sequence number before it is sent, kept until the controller
// acknowledges it.
//
// DIR/seg-<first seq>.journal   segments of wrapped events (wire.hpp), rolled
//                               every segment_bytes; a segment is deleted
//                               once all its events are acknowledged
// DIR/acked                     the last acknowledged sequence (text)
//
// Bounded: an event that would take the segments past max_bytes is not
// spooled (it gets no sequence number) and is counted in overflow(); the
// caller reports it. A restart finds the sequence and the unacknowledged
// events where they were.
// Thread-safety: every member is thread-safe.
#pragma once

#include "journal.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ballast::cluster {

struct SpoolOptions {
  std::string dir;
  uint64_t max_bytes = 256ull << 20;
  uint64_t segment_bytes = 4ull << 20;
  bool durable = false;  // fdatasync each append (else the OS has it at once: survives a process kill)
};

class Spool {
 public:
  // Open (creating DIR), recovering sequence and cursor. Status.
  static int open(const SpoolOptions& options, const std::string& node, std::unique_ptr<Spool>* out);

  // Journal one event frame; its sequence in *seq. BALLAST_EFULL (counted)
  // when the bound is reached.
  int append(const unsigned char* frame, size_t size, uint64_t* seq);
  // Every sequence up to `seq` is applied by the controller: drop what is
  // no longer needed.
  void acknowledge(uint64_t seq);
  // The controller applied up to `seq` although this spool never had those
  // numbers (it lost its spool): continue numbering after it.
  void skip_to(uint64_t seq);
  // Read spooled frames with first <= seq <= last, in order, until fn returns
  // false. Status.
  int read(uint64_t first, uint64_t last, const std::function<bool(uint64_t, const std::vector<unsigned char>&)>& fn);

  uint64_t last_seq() const;  // highest sequence given (0 = none)
  uint64_t acked() const;     // highest acknowledged
  uint64_t overflow() const;  // events refused by the bound since the spool was made
  uint64_t bytes() const;     // size of the segments on disk

 private:
  Spool() = default;
  int roll(uint64_t first_seq);
  void persist_cursor();

  SpoolOptions options_;
  std::string node_;
  mutable std::mutex mutex_;
  std::map<uint64_t, uint64_t> segments_;  // first seq -> bytes
  JournalWriter writer_;
  uint64_t writer_first_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t acked_ = 0;
  uint64_t bytes_ = 0;
  uint64_t overflow_ = 0;
  std::vector<unsigned char> scratch_;
};

}  // namespace ballast::cluster
