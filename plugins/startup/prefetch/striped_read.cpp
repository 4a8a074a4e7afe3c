#include "striped_read.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

namespace ballast::startup {

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kMaxHeader = 100ull << 20;  // as the safetensors format itself caps it
uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

const std::map<std::string, uint64_t>& dtype_sizes() {
  static const std::map<std::string, uint64_t> m = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                                                    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                                                    {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  return m;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Up to `stripes` threads (the caller's among them) take the chunks of a
// `size`-byte file in order and run read_chunk(i, offset, length) on each,
// which returns "" or what went wrong; the first error stops the others and
// is thrown. progress, when given, grows by each chunk's length once read.
template <typename ReadChunk>
void for_each_chunk(uint64_t size, uint64_t chunk, unsigned stripes, std::atomic<uint64_t>* progress,
                    ReadChunk read_chunk) {
  size_t n = size_t((size + chunk - 1) / chunk);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::string error;
  std::mutex error_mu;
  auto worker = [&] {
    for (;;) {
      size_t i = next.fetch_add(1);
      if (i >= n || failed.load()) return;
      uint64_t off = uint64_t(i) * chunk;
      const uint64_t len = std::min(chunk, size - off);
      std::string why = read_chunk(i, off, len);
      if (why.empty() && progress != nullptr) progress->fetch_add(len, std::memory_order_relaxed);
      if (!why.empty()) {
        std::lock_guard<std::mutex> g(error_mu);
        if (!failed.exchange(true)) error = std::move(why);
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  unsigned t = std::max(1u, std::min<unsigned>(stripes, unsigned(std::max<size_t>(n, 1))));
  for (unsigned k = 1; k < t; ++k) threads.emplace_back(worker);
  worker();
  for (auto& th : threads) th.join();
  if (failed.load()) throw Error(error);
}

// The stripes pread their chunks into place and checksum each right after
// reading it.
void read_striped(const std::string& path, int fd, unsigned char* dst, uint64_t size, uint64_t chunk, unsigned stripes,
                  bool direct, std::vector<uint32_t>& crcs, std::atomic<uint64_t>* progress) {
  crcs.assign(size_t((size + chunk - 1) / chunk), 0);
  for_each_chunk(size, chunk, stripes, progress, [&](size_t i, uint64_t off, uint64_t len) -> std::string {
    // O_DIRECT needs whole pages: the buffer has room for the rounded tail.
    uint64_t want = direct ? round_up(len, kPage) : len;
    uint64_t got = 0;
    while (got < len) {
      ssize_t r = ::pread(fd, dst + off + got, want - got, off_t(off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        return path + ": read at offset " + std::to_string(off + got) + ": " +
               (r < 0 ? errno_text(errno) : std::string("file shrank while loading"));
      }
      got += uint64_t(r);
    }
    crcs[i] = crc32c(dst + off, len);
    return {};
  });
}

// The mapped load: the file is mapped and the stripes bring it into the page
// cache, chunk by chunk: readahead() queues the chunk's reads, the
// MADV_POPULATE_READ that follows waits for them and fills in the page tables
// (it reads whatever readahead() left out, e.g. where read_ahead_kb is smaller
// than a chunk), and the checksum then reads the chunk through the mapping.
// Why not a fresh anonymous buffer: the kernel zeroes every page of one before
// a read may land in it, and in a VM whose freed memory has gone back to the
// host each of those first writes is a host fault charged to the guest's
// vCPUs (about 1.2-1.8 s of CPU per GiB here, against 0.1-0.5 s for the page
// cache, whose pages the device fills without being zeroed first).
void read_mapped(const std::string& path, int fd, const unsigned char* map, uint64_t size, uint64_t chunk,
                 unsigned stripes, std::vector<uint32_t>& crcs, std::atomic<uint64_t>* progress) {
  crcs.assign(size_t((size + chunk - 1) / chunk), 0);
  for_each_chunk(size, chunk, stripes, progress, [&](size_t i, uint64_t off, uint64_t len) -> std::string {
    ::readahead(fd, off_t(off), size_t(len));  // a hint: failing it only costs speed
    // EINVAL: a kernel before 5.14; the checksum's own page faults read the chunk then.
    int rc = ::madvise(const_cast<unsigned char*>(map) + off, size_t(len), MADV_POPULATE_READ);
    if (rc != 0 && errno != EINVAL) {
      return path + ": read of bytes [" + std::to_string(off) + ", " + std::to_string(off + len) +
             "): " + (errno == EFAULT ? std::string("file shrank while loading, or an I/O error") : errno_text(errno));
    }
    crcs[i] = crc32c(map + off, len);
    return {};
  });
}

// An open-file-description lock on one byte; wait = block until granted.
bool ofd_lock(int fd, short type, off_t byte, bool wait) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  for (;;) {
    if (::fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0) return true;
    if (errno != EINTR) return false;
  }
}

// Shared segment layout: one header page (then the chunk CRCs), the data at a
// page boundary so that O_DIRECT can read straight into it.
struct SegmentHeader {
  char magic[8];
  uint64_t ready;  // 1 once data and CRCs are complete
  uint64_t size, chunk_bytes, chunks, data_offset;
  uint64_t dev, ino;
  int64_t mtime_ns;
};

}  // namespace

bool is_safetensors_path(const std::string& path) {
  return path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
}

SafetensorsHeader parse_safetensors_header(const std::string& path, int fd, uint64_t file_size) {
  if (file_size < 8)
    throw Error(path + ": truncated safetensors header (" + std::to_string(file_size) +
                " bytes, need 8 for the length)");
  unsigned char lenb[8];
  if (::pread(fd, lenb, 8, 0) != 8) throw Error(path + ": cannot read the safetensors header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(lenb[i]) << (8 * i);
  if (n > kMaxHeader)
    throw Error(path + ": safetensors header length " + std::to_string(n) + " is implausible (> 100 MiB)");
  if (n > file_size - 8)
    throw Error(path + ": truncated safetensors header (says " + std::to_string(n) + " bytes, the file has " +
                std::to_string(file_size - 8) + " after the length)");
  std::string text(size_t(n), '\0');
  if (n > 0 && ::pread(fd, text.data(), size_t(n), 8) != ssize_t(n))
    throw Error(path + ": cannot read the safetensors header");
  nlohmann::json j;
  // The JSON library keeps the last of two equal keys: a tensor named twice
  // would silently lose one. Seen through the parser's callback instead.
  std::set<std::string> names;
  std::string twice;
  auto on_parse = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && twice.empty() &&
        !names.insert(parsed.get<std::string>()).second) {
      twice = parsed.get<std::string>();
    }
    return true;
  };
  try {
    j = nlohmann::json::parse(text, on_parse);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path + ": safetensors header is not JSON (byte " + std::to_string(e.byte) + " of the header)");
  } catch (const nlohmann::json::out_of_range&) {
    throw Error(path + ": safetensors header has a number too large for a double");
  }
  if (!twice.empty()) throw Error(path + ": safetensors header names tensor \"" + twice + "\" twice");
  if (!j.is_object()) throw Error(path + ": safetensors header is not a JSON object");
  SafetensorsHeader h;
  h.header_bytes = n;
  h.data_offset = 8 + n;
  const uint64_t data_size = file_size - h.data_offset;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    std::string where = path + ": tensor \"" + name + "\"";
    if (name == "__metadata__") {
      if (!v.is_object()) throw Error(path + ": \"__metadata__\" must be an object");
      continue;
    }
    if (!v.is_object()) throw Error(where + " must be an object");
    TensorInfo t;
    t.name = name;
    if (!v.contains("dtype") || !v["dtype"].is_string()) throw Error(where + ": field \"dtype\" must be a string");
    t.dtype = v["dtype"].get<std::string>();
    auto ds = dtype_sizes().find(t.dtype);
    if (ds == dtype_sizes().end()) throw Error(where + ": unknown dtype \"" + t.dtype + "\"");
    if (!v.contains("shape") || !v["shape"].is_array()) throw Error(where + ": field \"shape\" must be an array");
    uint64_t elems = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw Error(where + ": field \"shape\" must hold non-negative integers");
      uint64_t x = d.get<uint64_t>();
      if (x > (uint64_t(1) << 62) || (x != 0 && elems > (uint64_t(1) << 62) / x))
        throw Error(where + ": field \"shape\" overflows");
      elems *= x;
      t.shape.push_back(int64_t(x));
    }
    const auto& off = v.contains("data_offsets") ? v["data_offsets"] : nlohmann::json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw Error(where + ": field \"data_offsets\" must be [begin, end]");
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    if (t.end < t.begin)
      throw Error(where + ": data_offsets end " + std::to_string(t.end) + " < begin " + std::to_string(t.begin));
    if (t.end > data_size)
      throw Error(where + ": data_offsets end " + std::to_string(t.end) + " is past the data section (" +
                  std::to_string(data_size) + " bytes): truncated file?");
    // 2^61 eight-byte elements would wrap to 0 bytes.
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(elems, ds->second, &bytes) || t.end - t.begin != bytes)
      throw Error(where + ": " + std::to_string(t.end - t.begin) + " bytes for shape of " + std::to_string(elems) +
                  " x " + t.dtype);
    h.tensors.push_back(std::move(t));
  }
  std::vector<const TensorInfo*> order;
  for (const auto& t : h.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->begin < order[i - 1]->end)
      throw Error(path + ": tensors \"" + order[i - 1]->name + "\" and \"" + order[i]->name + "\" overlap");
  return h;
}

uint32_t chunked_checksum(const std::vector<uint32_t>& crcs) {
  std::string bytes;
  for (uint32_t c : crcs)
    for (int i = 0; i < 4; ++i) bytes.push_back(char(c >> (8 * i)));
  return crc32c(bytes.data(), bytes.size());
}

std::string sums_path(const std::string& path) { return path + ".crc32c"; }

void write_sums(const LoadedFile& f) {
  nlohmann::json j = {{"format", "ballast-chunk-crc32c"},
                      {"size", f.size},
                      {"chunk_bytes", f.chunk_bytes},
                      {"checksum", f.checksum},
                      {"chunks", f.chunk_crcs}};
  std::string p = sums_path(f.path), tmp = p + ".tmp." + std::to_string(::getpid());
  std::ofstream out(tmp, std::ios::trunc);
  out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  out.close();
  if (!out || std::rename(tmp.c_str(), p.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(p + ": cannot write checksums");
  }
}

double resident_fraction(const std::string& path) {
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  struct stat st {};
  if (fd.fd < 0 || ::fstat(fd.fd, &st) != 0 || st.st_size == 0) return 0;
  void* m = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd.fd, 0);
  if (m == MAP_FAILED) return 0;
  size_t pages = size_t(round_up(uint64_t(st.st_size), kPage) / kPage);
  std::vector<unsigned char> vec(pages);
  size_t resident = 0;
  if (::mincore(m, size_t(st.st_size), vec.data()) == 0)
    for (unsigned char v : vec) resident += v & 1;
  ::munmap(m, size_t(st.st_size));
  return double(resident) / double(pages);
}

LoadedFile& LoadedFile::operator=(LoadedFile&& o) noexcept {
  if (this == &o) return *this;
  this->~LoadedFile();
  path = std::move(o.path);
  size = o.size;
  data = o.data;
  chunk_bytes = o.chunk_bytes;
  chunk_crcs = std::move(o.chunk_crcs);
  checksum = o.checksum;
  direct = o.direct;
  shared = o.shared;
  read_here = o.read_here;
  mapped = o.mapped;
  verified = o.verified;
  seconds = o.seconds;
  header = std::move(o.header);
  map_ = o.map_;
  map_bytes_ = o.map_bytes_;
  lock_fd_ = o.lock_fd_;
  shm_path_ = std::move(o.shm_path_);
  o.map_ = nullptr;
  o.lock_fd_ = -1;
  o.data = nullptr;
  return *this;
}

LoadedFile::~LoadedFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  if (lock_fd_ >= 0) {
    // The last process to let go removes the segment (if the path still
    // names it); one that opened it in between keeps a valid unlinked copy.
    // Our own read lock goes first: two users leaving together each held it
    // while the other tried for the write lock, and neither removed it.
    struct stat mine {
    }, named{};
    ofd_lock(lock_fd_, F_UNLCK, 1, false);
    if (ofd_lock(lock_fd_, F_WRLCK, 1, false) && ::fstat(lock_fd_, &mine) == 0 &&
        ::stat(shm_path_.c_str(), &named) == 0 && mine.st_ino == named.st_ino)
      ::unlink(shm_path_.c_str());
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
}

// One load_file call, phase by phase: open, the expected checksums, how to
// read, the read itself (a node's shared segment, the mapped file, or memory
// of our own), and the check against the checksums.
struct FileLoad {
  const std::string& path;
  const LoadOptions& opt;
  LoadedFile f;
  Fd fd;
  struct stat st {};
  std::vector<uint32_t> expected;  // from FILE.crc32c
  bool mapped = false, direct = false;
  Fd dfd;  // the O_DIRECT descriptor, when direct
  uint64_t chunks = 0, span = 0;

  FileLoad(const std::string& p, const LoadOptions& o) : path(p), opt(o) { f.path = p; }

  void open() {
    fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd.fd < 0) throw Error(path + ": " + errno_text(errno));
    ::fstat(fd.fd, &st);
    if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
    f.size = uint64_t(st.st_size);
    if (is_safetensors_path(path)) f.header = parse_safetensors_header(path, fd.fd, f.size);
  }

  // Expected checksums, when FILE.crc32c exists; their chunk size wins.
  void read_expected_sums() {
    f.chunk_bytes = opt.chunk_bytes;
    if (!opt.verify || ::access(sums_path(path).c_str(), F_OK) != 0) return;
    const std::string sp = sums_path(path);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(sp));
    } catch (const nlohmann::json::exception&) {  // a syntax error or a number out of range
      throw Error(sp + ": not JSON");
    }
    if (!j.is_object() || j.value("format", "") != "ballast-chunk-crc32c" || !j.contains("chunks") ||
        !j["chunks"].is_array() || !j.contains("chunk_bytes") || !j["chunk_bytes"].is_number_unsigned())
      throw Error(sp + ": not a ballast-chunk-crc32c file");
    if (j.value("size", uint64_t(0)) != f.size)
      throw Error(path + ": size " + std::to_string(f.size) + " differs from " + sp + " (" +
                  std::to_string(j.value("size", uint64_t(0))) + "): stale checksums or a changed file");
    f.chunk_bytes = j["chunk_bytes"].get<uint64_t>();
    if (f.chunk_bytes == 0 || f.chunk_bytes % kPage != 0)
      throw Error(sp + ": field \"chunk_bytes\" must be a multiple of 4096");
    expected = j["chunks"].get<std::vector<uint32_t>>();
  }

  // Without a destination, a shared segment or O_DIRECT asked for, the file
  // is mapped: its page cache is the destination. Otherwise O_DIRECT when
  // asked, or when the file is mostly cold.
  void choose_mode() {
    mapped = opt.destination == nullptr && !opt.share && opt.direct != 1 && f.size > 0;
    direct = !mapped && (opt.direct == 1 || (opt.direct < 0 && resident_fraction(path) < 0.5));
    if (opt.destination != nullptr && reinterpret_cast<uintptr_t>(opt.destination) % kPage != 0) direct = false;
    if (direct) {
      dfd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (dfd.fd < 0) direct = false;  // tmpfs and some FUSE mounts refuse O_DIRECT
    }
    f.direct = direct;
    chunks = (f.size + f.chunk_bytes - 1) / f.chunk_bytes;
    // O_DIRECT reads whole pages, so the destination needs room for the tail.
    span = round_up(std::max<uint64_t>(f.size, 1), kPage);
  }

  int read_fd() const { return direct ? dfd.fd : fd.fd; }

  void* map_segment() {
    void* m = ::mmap(nullptr, f.map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, f.lock_fd_, 0);
    if (m == MAP_FAILED) throw Error(f.shm_path_ + ": mmap: " + errno_text(errno));
    return m;
  }

  // The node's shared copy in /dev/shm. Byte 0 of the segment is the load
  // lock: whoever gets it first reads the file in, the others wait for it
  // and then find the segment ready. A reader that dies releases it and the
  // next one reads again. Byte 1 is held shared by every process using the
  // segment. Open-file-description locks, so that two loads in one process
  // do not share a lock.
  void load_shared() {
    Sha256 h;
    std::string id = std::filesystem::absolute(path).lexically_normal().string() + "|" + std::to_string(st.st_dev) +
                     "|" + std::to_string(st.st_ino) + "|" + std::to_string(f.size) + "|" +
                     std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + "|" +
                     std::to_string(f.chunk_bytes);
    h.update(id.data(), id.size());
    f.shm_path_ = "/dev/shm/ballast-ckpt-" + h.hex().substr(0, 24);
    f.lock_fd_ = ::open(f.shm_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (f.lock_fd_ < 0) throw Error(f.shm_path_ + ": " + errno_text(errno));
    if (!ofd_lock(f.lock_fd_, F_WRLCK, 0, true)) throw Error(f.shm_path_ + ": lock: " + errno_text(errno));
    const uint64_t head = round_up(sizeof(SegmentHeader) + 4 * chunks, kPage);
    f.map_bytes_ = head + span;
    struct stat sst {};
    ::fstat(f.lock_fd_, &sst);
    bool ready = false;
    if (uint64_t(sst.st_size) == f.map_bytes_) {
      f.map_ = map_segment();
      auto* sh = static_cast<SegmentHeader*>(f.map_);
      ready = std::memcmp(sh->magic, "BLSTCKPT", 8) == 0 && sh->ready == 1 && sh->size == f.size &&
              sh->chunks == chunks && sh->ino == uint64_t(st.st_ino);
    }
    if (!ready) {
      if (f.map_ != nullptr) ::munmap(f.map_, f.map_bytes_);
      f.map_ = nullptr;
      if (::ftruncate(f.lock_fd_, 0) != 0 || ::ftruncate(f.lock_fd_, off_t(f.map_bytes_)) != 0)
        throw Error(f.shm_path_ + ": cannot size the shared segment: " + errno_text(errno));
      f.map_ = map_segment();
      auto* sh = static_cast<SegmentHeader*>(f.map_);
      read_striped(path, read_fd(), static_cast<unsigned char*>(f.map_) + head, f.size, f.chunk_bytes, opt.stripes,
                   direct, f.chunk_crcs, opt.progress_bytes);
      std::memcpy(reinterpret_cast<unsigned char*>(f.map_) + sizeof(SegmentHeader), f.chunk_crcs.data(), 4 * chunks);
      std::memcpy(sh->magic, "BLSTCKPT", 8);
      sh->size = f.size;
      sh->chunk_bytes = f.chunk_bytes;
      sh->chunks = chunks;
      sh->data_offset = head;
      sh->dev = st.st_dev;
      sh->ino = st.st_ino;
      sh->mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
      __atomic_store_n(&sh->ready, 1, __ATOMIC_RELEASE);
    } else {
      f.read_here = false;
      f.chunk_crcs.resize(chunks);
      std::memcpy(f.chunk_crcs.data(), reinterpret_cast<unsigned char*>(f.map_) + sizeof(SegmentHeader), 4 * chunks);
    }
    ofd_lock(f.lock_fd_, F_RDLCK, 1, true);  // in use: the last user removes it
    ofd_lock(f.lock_fd_, F_UNLCK, 0, false);
    f.data = static_cast<unsigned char*>(f.map_) + head;
    f.shared = true;
  }

  // The file mapped read-only, its chunks brought into the page cache.
  // False when the file system cannot map files.
  bool load_mapped() {
    f.map_ = ::mmap(nullptr, f.size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
    if (f.map_ == MAP_FAILED) {
      f.map_ = nullptr;
      return false;
    }
    f.map_bytes_ = f.size;
    f.mapped = true;
    read_mapped(path, fd.fd, static_cast<unsigned char*>(f.map_), f.size, f.chunk_bytes, opt.stripes, f.chunk_crcs,
                opt.progress_bytes);
    f.data = static_cast<unsigned char*>(f.map_);
    return true;
  }

  // Into the caller's destination, or memory of our own.
  void load_private() {
    unsigned char* dst = nullptr;
    if (opt.destination != nullptr) {
      if (opt.capacity < (direct ? span : f.size))
        throw Error(path + ": destination holds " + std::to_string(opt.capacity) + " bytes, the file needs " +
                    std::to_string(direct ? span : f.size));
      dst = static_cast<unsigned char*>(opt.destination);
    } else {
      f.map_bytes_ = span;
      f.map_ = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (f.map_ == MAP_FAILED) {
        f.map_ = nullptr;
        throw Error(path + ": cannot allocate " + std::to_string(span) + " bytes");
      }
      dst = static_cast<unsigned char*>(f.map_);
    }
    read_striped(path, read_fd(), dst, f.size, f.chunk_bytes, opt.stripes, direct, f.chunk_crcs, opt.progress_bytes);
    f.data = dst;
  }

  void verify() {
    f.checksum = chunked_checksum(f.chunk_crcs);
    if (expected.empty() && !(opt.verify && ::access(sums_path(path).c_str(), F_OK) == 0)) return;
    if (expected.size() != f.chunk_crcs.size())
      throw Error(path + ": " + std::to_string(f.chunk_crcs.size()) + " chunks but " + sums_path(path) + " lists " +
                  std::to_string(expected.size()));
    for (size_t i = 0; i < expected.size(); ++i)
      if (expected[i] != f.chunk_crcs[i])
        throw Error(path + ": checksum mismatch in bytes [" + std::to_string(i * f.chunk_bytes) + ", " +
                    std::to_string(std::min<uint64_t>((i + 1) * f.chunk_bytes, f.size)) + ") (chunk " +
                    std::to_string(i) + ")");
    f.verified = true;
  }
};

LoadedFile load_file(const std::string& path, const LoadOptions& opt) {
  if (opt.chunk_bytes == 0 || opt.chunk_bytes % kPage != 0)
    throw Error("chunk size must be a positive multiple of 4096, not " + std::to_string(opt.chunk_bytes));
  const int64_t t0 = monotonic_ns();
  FileLoad load(path, opt);
  load.open();
  load.read_expected_sums();
  load.choose_mode();
  if (opt.share) {
    load.load_shared();
  } else if (!load.mapped || !load.load_mapped()) {
    load.load_private();
  }
  load.verify();
  load.f.seconds = double(monotonic_ns() - t0) / 1e9;
  return std::move(load.f);
}

}  // namespace ballast::startup
