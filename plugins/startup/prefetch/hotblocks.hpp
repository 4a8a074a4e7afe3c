// Hot-block profiles: which blocks of which files a job read during its
// start, in the order it first needed them, and the prefetcher that replays
// them on the next start.
//
// Profile file (JSON):
//   {"format":"ballast-startup-hotblocks","version":1,"block_bytes":262144,
//    "files":[{"path":"/x/a.py","size":..,"mtime_ns":..,"dev":..,"ino":..},...],
//    "extents":[[file_index, offset, length], ...]}      first-need order
#pragma once

#include <atomic>
#include <cstdint>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "util.hpp"

namespace ballast::startup {

struct HotFile {
  std::string path;
  FileId id;
};

struct Extent {
  uint32_t file = 0;
  uint64_t offset = 0, length = 0;
};

struct HotProfile {
  uint64_t block_bytes = 256 * 1024;
  std::vector<HotFile> files;
  std::vector<Extent> extents;  // first-need order; adjacent blocks merged
  uint64_t bytes() const;
};

// Builds a profile from the interposer's access log, one line per read (see interpose.c).
// Files that vanished or were replaced while the job ran are left out, and
// so are files under any of the `exclude` prefixes (a checkpoint directory
// that `ballast startup load` reads anyway, scratch files).
HotProfile profile_from_access_log(const std::string& log_path, uint64_t block_bytes,
                                   const std::vector<std::string>& exclude = {});
void write_profile(const std::string& path, const HotProfile& profile);  // write, then rename
HotProfile read_profile(const std::string& path);                        // throws Error "FILE: field ..."

struct PrefetchOptions {
  unsigned threads = 8;
  uint64_t budget_bytes = 0;    // 0 = half of MemAvailable
  uint64_t io_bytes = 1 << 20;  // largest single read
};

struct PrefetchStats {
  size_t files_ok = 0, files_skipped = 0;
  uint64_t planned_bytes = 0, done_bytes = 0, budget_cut_bytes = 0;
  size_t errors = 0;
  bool stopped_early = false;
  std::vector<std::string> messages;  // one per skipped file: path and reason
};

// Reads a profile's blocks into the page cache with several threads, each
// taking the next piece in first-need order, never past the memory budget.
// Files whose size, mtime or inode changed since the profile, or that
// vanished, are skipped (with a message). The job is never waited on: it
// runs beside the prefetcher and reads what it needs itself.
class Prefetcher {
 public:
  Prefetcher(const HotProfile& profile, const PrefetchOptions& options);
  ~Prefetcher();  // stops and joins
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  void start();
  // Watch the job (pid and its descendants) while prefetching: when it has
  // opened `limit` regular files and none of them is in the profile, the
  // profile is taken for another job's and prefetching stops. Call after start().
  void watch(int pid, size_t limit = 16);
  // True once every worker has returned (all pieces read, or stopped): what a
  // node agent waits for before starting bulk reads that would otherwise
  // compete with the hot blocks the job needs first. Never blocks.
  bool idle() const { return running_.load() == 0; }
  void stop();                                           // ask the threads to finish their current read and return
  void wait();                                           // join
  const PrefetchStats& stats() const { return stats_; }  // after wait()
  // While it runs (any thread): the bytes read so far, of those planned.
  uint64_t done_bytes() const { return done_bytes_.load(); }
  uint64_t planned_bytes() const { return stats_.planned_bytes; }  // fixed at construction

 private:
  struct Piece {
    uint32_t file;
    uint64_t offset, length;
  };
  void worker();

  PrefetchOptions options_;
  std::vector<HotFile> files_;  // as recorded; opened by the workers as they go
  std::vector<Piece> pieces_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> done_bytes_{0};
  std::atomic<size_t> errors_{0};
  std::atomic<unsigned> running_{0};  // workers started and not yet returned
  std::vector<std::thread> threads_;
  std::thread watcher_;
  std::string watch_message_;
  PrefetchStats stats_;
};

// The (dev, ino) of the regular files that process `pid` and its
// descendants have open now, from /proc.
std::vector<std::pair<uint64_t, uint64_t>> open_files_of(int pid);

// Decides from the files a job opens whether a profile is its own: stop()
// once `limit` distinct files were seen and none was in the profile; a
// single hit settles that the profile fits.
class RelevanceCheck {
 public:
  RelevanceCheck(const std::vector<HotFile>& files, size_t limit);
  enum Verdict { kUndecided, kRelevant, kWrongProfile };
  Verdict observe(const std::vector<std::pair<uint64_t, uint64_t>>& open);
  size_t seen() const { return seen_.size(); }

 private:
  std::set<std::pair<uint64_t, uint64_t>> profile_, seen_;
  size_t limit_;
  Verdict verdict_ = kUndecided;
};

uint64_t mem_available_bytes();  // from /proc/meminfo, 0 if unknown

}  // namespace ballast::startup
