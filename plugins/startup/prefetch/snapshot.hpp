// Dependency snapshots: a zstd-compressed archive of an installed
// environment directory, kept in a store under a key derived from the
// lockfile(s) and the platform.
//
// Archive file (".bsnap"):
//   "BSNAP001"                      8 bytes, magic
//   zstd stream (content checksum on) of the entries:
//     u8 type (1 file, 2 dir, 3 symlink; 0 ends), u32 mode, i64 mtime_ns,
//     u32 path length, path (relative, no ".."), u64 data length, data,
//     u32 crc32c(data)
//   footer, 32 bytes: u64 compressed length, u64 entries length,
//     u32 crc32c(compressed bytes), u32 entry count, "BSNAPEND"
// Integers are little-endian. A restore checks every entry's CRC, the zstd
// checksum and the whole-archive CRC, into a temporary directory that is
// renamed over the target only when everything matched.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "util.hpp"

namespace ballast::startup {

// The archive itself is bad (corrupted, truncated, unsafe): it is discarded.
struct Corrupt : Error {
  using Error::Error;
};

struct SnapshotInfo {
  uint64_t files = 0, dirs = 0, symlinks = 0;
  uint64_t data_bytes = 0;     // file contents
  uint64_t archive_bytes = 0;  // on disk
};

// Archives `dir` into `archive` (written to archive + ".tmp.<pid>", synced,
// renamed). Throws Error naming the file; leaves no partial archive behind.
SnapshotInfo create_snapshot(const std::string& dir, const std::string& archive, int zstd_level = 3);

// Restores `archive` into `dir`, replacing it as a whole. Throws Error
// (corrupted, truncated, unsafe path, disk full) and then leaves `dir`
// exactly as it was.
SnapshotInfo restore_snapshot(const std::string& archive, const std::string& dir);

// The key of an environment: SHA-256 over the lockfiles' contents, the
// platform string and the target directory (installed environments embed
// their absolute path). Throws Error when a lockfile cannot be read.
std::string environment_key(const std::vector<std::string>& lockfiles, const std::string& platform,
                            const std::string& dir);
std::string default_platform();  // "Linux-x86_64-glibc2.36"

// Removes the least recently used snapshots of `store` until the total is
// at most cap_bytes, never touching `keep`. Returns the removed paths.
std::vector<std::string> evict_snapshots(const std::string& store, uint64_t cap_bytes, const std::string& keep);

struct EnvOptions {
  std::vector<std::string> lockfiles;
  std::string dir, store, platform;
  uint64_t cap_bytes = 20ull << 30;
  std::vector<std::string> install;  // argv
};

struct EnvResult {
  int exit_code = 0;
  std::string action;  // "restored", "installed+snapshot", "installed", "failed"
  std::string key;
  uint64_t bytes = 0;
  std::vector<std::string> messages;
};

// `ballast startup env`: restore the matching snapshot, or run the install
// and snapshot its result. Builders of one key on several nodes serialise on
// an flock of <store>/<key>.lock: the first installs, the others restore.
EnvResult run_env(const EnvOptions& options);

// Runs argv (execvp) with extra environment variables and waits; returns the
// exit status (128+signal when killed, 127 when it could not start).
// started(pid), when given, is called once the child exists.
int run_process(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env = {},
                const std::function<void(int)>& started = {});

}  // namespace ballast::startup
