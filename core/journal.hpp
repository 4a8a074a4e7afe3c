// The journal: an append-only on-disk log of events, one frame each
// (event_codec.hpp). Replayable; a truncated or corrupted frame is reported
// with its byte offset and skipped (resynchronising on the next magic) or
// refused, never trusted.
#pragma once

#include "event_codec.hpp"

#include <cstdio>
#include <functional>
#include <mutex>
#include <string>

namespace ballast {

class JournalWriter {
 public:
  // direct: append() writes its frame before it returns. grouped: append()
  // hands the frame over, and everything handed over since the last write
  // is written in one write (group commit: one write per burst, not per
  // event), by the writer's own thread or, once 256 KiB wait, by the
  // appender that finds them; flush() waits until it is written. What is
  // handed over and not yet written is in memory only, like an event in a
  // bus queue; at most 8 MiB of it, then append() waits.
  enum class Mode { direct, grouped };
  JournalWriter() = default;
  ~JournalWriter();
  JournalWriter(const JournalWriter&) = delete;
  JournalWriter& operator=(const JournalWriter&) = delete;
  // Open `path` for appending (created if missing). Status; message names the file.
  int open(const std::string& path, Mode mode = Mode::direct);
  // Append one event (one write of the whole frame). Thread-safe.
  int append(const ballast_event& event);
  // Append `count` events in one write (a batch that arrived together): all
  // are checked and encoded first, so a bad one writes none. Thread-safe.
  int append_batch(const ballast_event* events, size_t count);
  // Append frames already encoded (`size` bytes of whole frames, as
  // decode_frame read them): written as they are. Thread-safe.
  int append_frames(const unsigned char* frames, size_t size);
  // Everything appended written to the OS (fdatasync too when durable is true).
  int flush(bool durable = false);
  void close();

 private:
  struct Impl;
  int write_all(const unsigned char* data, size_t size);
  int hand_over(const unsigned char* frames, size_t size);
  void write_pending(std::unique_lock<std::mutex>& lock);
  void writer_loop();
  Impl* impl_ = nullptr;
};

struct JournalProblem {
  uint64_t offset;     // byte offset of the bad frame in the file
  std::string reason;  // "truncated frame: header says 120 bytes, 37 left", ...
};

enum class JournalMode { skip_bad, refuse_bad };

// Read every frame of `path` in order, calling on_event for each good one and
// on_problem for each bad one. skip_bad resynchronises at the next frame
// magic; refuse_bad stops at the first problem and returns BALLAST_EFORMAT.
// Returns a status (BALLAST_ENOTFOUND / BALLAST_EIO for the file itself).
int read_journal(const std::string& path, JournalMode mode,
                 const std::function<void(const OwnedEvent&, uint64_t offset)>& on_event,
                 const std::function<void(const JournalProblem&)>& on_problem);

}  // namespace ballast
