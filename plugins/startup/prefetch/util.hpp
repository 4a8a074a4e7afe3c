// Small shared pieces of the start-up plugin: checksums, hashes, clocks,
// file identity, and the error type every part throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "crc32c.hpp"

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace ballast::startup {

// A failure with a message that names the file and the field.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// CRC-32C: plugins/common's, shared with libballast's journal frames.
using util::crc32c;
using util::crc32c_combine;
using util::crc32c_update;

// SHA-256 (OpenSSL's libcrypto), for keys (lockfile + platform), as 64
// lowercase hex digits. Throws Error when OpenSSL fails.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  std::string hex();  // finishes the hash; call once

 private:
  evp_md_ctx_st* ctx_;
};

int64_t wall_ns();       // CLOCK_REALTIME
int64_t monotonic_ns();  // CLOCK_MONOTONIC

// What identifies a file's content cheaply: a changed file changes one of these.
struct FileId {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileId&) const = default;
};
// stat(path); false (errno set) when it does not exist or is not a regular file.
bool file_id(const std::string& path, FileId& out);

std::string read_file(const std::string& path);  // whole file; throws Error naming it
std::string hostname();
std::string errno_text(int err);
std::string human_bytes(double bytes);

}  // namespace ballast::startup
