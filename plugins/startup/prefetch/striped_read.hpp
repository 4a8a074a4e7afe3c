// Striped checkpoint reads: a file is cut into chunks that several reader
// threads read in parallel, each thread checksumming the chunk it just read
// while the others keep the device busy. By default the file is mapped and
// the readers bring its chunks into the page cache (the mapping is the
// destination); into a caller's buffer, or with O_DIRECT asked for, they
// pread into that memory (O_DIRECT when the file is cold).
// Safetensors files have their header parsed and validated first. Ranks of
// one node can share one read through a /dev/shm segment: the first rank to
// lock it reads the file into it, the others wait on the lock and map it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "util.hpp"

namespace ballast::startup {

struct TensorInfo {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the data section
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // length of the JSON text
  uint64_t data_offset = 0;   // 8 + header_bytes
  std::vector<TensorInfo> tensors;
};

// Parses and validates the header of a safetensors file of `file_size`
// bytes: 8-byte little-endian length, JSON, every tensor's dtype, shape and
// data_offsets inside the file, no overlaps. Throws Error naming the field.
SafetensorsHeader parse_safetensors_header(const std::string& path, int fd, uint64_t file_size);
bool is_safetensors_path(const std::string& path);

struct LoadOptions {
  unsigned stripes = 8;            // reader threads
  uint64_t chunk_bytes = 8 << 20;  // unit of work and of the checksum; multiple of 4096
  // 1 = O_DIRECT into memory (a fresh allocation unless `destination`);
  // 0 / -1 = through the page cache, mapped (into `destination`: -1 = O_DIRECT
  // unless the file is mostly cached, 0 = buffered)
  int direct = -1;
  bool share = false;           // share one read among the processes of this node
  bool verify = true;           // check against FILE.crc32c when it exists
  void* destination = nullptr;  // caller's buffer (>= file size), or nullptr to allocate
  uint64_t capacity = 0;
  // When given: grows by each chunk's bytes as the stripes read them (a
  // progress line reads it from another thread).
  std::atomic<uint64_t>* progress_bytes = nullptr;
};

// A loaded file. Owns its memory (or the shared segment mapping) unless the
// caller gave a destination.
class LoadedFile {
 public:
  LoadedFile() = default;
  LoadedFile(const LoadedFile&) = delete;
  LoadedFile& operator=(const LoadedFile&) = delete;
  LoadedFile(LoadedFile&& o) noexcept { *this = std::move(o); }
  LoadedFile& operator=(LoadedFile&& o) noexcept;
  ~LoadedFile();

  std::string path;
  uint64_t size = 0;
  const unsigned char* data = nullptr;
  uint64_t chunk_bytes = 0;
  std::vector<uint32_t> chunk_crcs;
  uint32_t checksum = 0;  // crc32c over the chunk CRCs (little-endian), see chunked_checksum
  bool direct = false;    // read with O_DIRECT
  bool mapped = false;    // data maps the file (its page cache), read-only
  bool shared = false;    // lives in a /dev/shm segment
  bool read_here = true;  // false: another process read it into the segment
  bool verified = false;  // matched FILE.crc32c
  double seconds = 0;
  SafetensorsHeader header;  // empty for raw shards

 private:
  friend struct FileLoad;  // load_file, phase by phase (loader.cpp)
  void* map_ = nullptr;    // what to munmap
  uint64_t map_bytes_ = 0;
  int lock_fd_ = -1;  // shared segment: holds a read lock on byte 1 while mapped
  std::string shm_path_;
};

LoadedFile load_file(const std::string& path, const LoadOptions& options);

uint32_t chunked_checksum(const std::vector<uint32_t>& chunk_crcs);
// FILE.crc32c: {"format":"ballast-chunk-crc32c","size":..,"chunk_bytes":..,"checksum":..,"chunks":[..]}
void write_sums(const LoadedFile& f);
std::string sums_path(const std::string& path);

// Fraction of the file's pages in the page cache (mincore), 0..1.
double resident_fraction(const std::string& path);

}  // namespace ballast::startup
