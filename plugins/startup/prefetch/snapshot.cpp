#include "snapshot.hpp"

#include <fcntl.h>
#include <gnu/libc-version.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "util.hpp"

namespace fs = std::filesystem;

namespace ballast::startup {

namespace {

constexpr char kMagic[8] = {'B', 'S', 'N', 'A', 'P', '0', '0', '1'};
constexpr char kEnd[8] = {'B', 'S', 'N', 'A', 'P', 'E', 'N', 'D'};
constexpr size_t kFooter = 32;
enum : uint8_t { kEndEntry = 0, kFile = 1, kDir = 2, kSymlink = 3 };

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(char(v >> (8 * i)));
}
uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw Error(path + ": write: " + errno_text(errno));
    p += w;
    n -= size_t(w);
  }
}

// Compresses a stream of bytes into fd, keeping the CRC and length of what
// it wrote.
class Deflater {
 public:
  Deflater(int fd, std::string path, int level) : fd_(fd), path_(std::move(path)), cctx_(ZSTD_createCCtx()) {
    if (cctx_ == nullptr) throw Error("zstd: cannot create a compression context");
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_nbWorkers, 2);  // ignored by a single-threaded libzstd
    out_.resize(ZSTD_CStreamOutSize());
  }
  ~Deflater() { ZSTD_freeCCtx(cctx_); }
  void add(const void* data, size_t n) {
    raw_ += n;
    ZSTD_inBuffer in{data, n, 0};
    while (in.pos < in.size) pump(&in, ZSTD_e_continue);
  }
  void finish() {
    ZSTD_inBuffer in{nullptr, 0, 0};
    while (pump(&in, ZSTD_e_end) != 0) {
    }
  }
  uint64_t raw() const { return raw_; }
  uint64_t written() const { return written_; }
  uint32_t crc() const { return crc_; }

 private:
  size_t pump(ZSTD_inBuffer* in, ZSTD_EndDirective mode) {
    ZSTD_outBuffer out{out_.data(), out_.size(), 0};
    size_t left = ZSTD_compressStream2(cctx_, &out, in, mode);
    if (ZSTD_isError(left)) throw Error(path_ + ": zstd: " + ZSTD_getErrorName(left));
    write_all(fd_, out_.data(), out.pos, path_);
    crc_ = crc32c_update(crc_, out_.data(), out.pos);
    written_ += out.pos;
    return left;
  }
  int fd_;
  std::string path_;
  ZSTD_CCtx* cctx_;
  std::vector<char> out_;
  uint64_t raw_ = 0, written_ = 0;
  uint32_t crc_ = 0;
};

// Pulls decompressed bytes from the compressed region of an archive.
class Inflater {
 public:
  Inflater(int fd, uint64_t compressed, std::string path)
      : fd_(fd), left_(compressed), path_(std::move(path)), dctx_(ZSTD_createDCtx()) {
    if (dctx_ == nullptr) throw Error("zstd: cannot create a decompression context");
    in_.resize(ZSTD_DStreamInSize());
    out_.resize(ZSTD_DStreamOutSize());
  }
  ~Inflater() { ZSTD_freeDCtx(dctx_); }
  void read(void* dst, size_t n) {
    char* d = static_cast<char*>(dst);
    while (n > 0) {
      if (out_pos_ == out_len_) refill();
      size_t take = std::min(n, out_len_ - out_pos_);
      std::memcpy(d, out_.data() + out_pos_, take);
      out_pos_ += take;
      d += take;
      n -= take;
    }
  }
  // After the end entry: the frame must be complete (its checksum verified)
  // and every compressed byte consumed.
  void expect_end() {
    if (out_pos_ != out_len_ || frame_left_ != 0 || left_ != 0 || in_pos_ != in_len_)
      throw Corrupt(path_ + ": data after the last entry (corrupted)");
  }
  uint32_t crc() const { return crc_; }

 private:
  void refill() {
    for (;;) {
      if (in_pos_ == in_len_) {
        if (left_ == 0) throw Corrupt(path_ + ": truncated (the archive ends inside an entry)");
        size_t want = size_t(std::min<uint64_t>(left_, in_.size()));
        ssize_t r = ::read(fd_, in_.data(), want);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) throw Corrupt(path_ + ": truncated or unreadable: " + (r < 0 ? errno_text(errno) : "end of file"));
        crc_ = crc32c_update(crc_, in_.data(), size_t(r));
        left_ -= uint64_t(r);
        in_len_ = size_t(r);
        in_pos_ = 0;
      }
      ZSTD_inBuffer in{in_.data(), in_len_, in_pos_};
      ZSTD_outBuffer out{out_.data(), out_.size(), 0};
      size_t rc = ZSTD_decompressStream(dctx_, &out, &in);
      if (ZSTD_isError(rc)) throw Corrupt(path_ + ": corrupted (zstd: " + ZSTD_getErrorName(rc) + ")");
      in_pos_ = in.pos;
      frame_left_ = rc;
      out_pos_ = 0;
      out_len_ = out.pos;
      if (out_len_ > 0) return;
      if (rc == 0 && in_pos_ == in_len_ && left_ == 0)
        throw Corrupt(path_ + ": truncated (the archive ends inside an entry)");
    }
  }
  int fd_;
  uint64_t left_;
  std::string path_;
  ZSTD_DCtx* dctx_;
  std::vector<char> in_, out_;
  size_t in_pos_ = 0, in_len_ = 0, out_pos_ = 0, out_len_ = 0, frame_left_ = 1;
  uint32_t crc_ = 0;
};

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// A relative path that stays inside the target: no "..", not absolute.
bool safe_relative(const std::string& p) {
  if (p.empty() || p[0] == '/') return false;
  for (const auto& part : fs::path(p))
    if (part == ".." || part == ".") return false;
  return true;
}

// An entry that cannot be created: a missing parent, a duplicate or a file
// where a directory should be means the entries are inconsistent (the zstd
// checksum is only checked at the end of the frame, so garbage can come
// first); anything else (a full disk) is the machine's, not the archive's.
[[noreturn]] void fail_create(const std::string& archive, const std::string& path) {
  int e = errno;
  if (e == ENOENT || e == EEXIST || e == ENOTDIR || e == EISDIR)
    throw Corrupt(archive + ": corrupted (inconsistent entry " + path + ": " + errno_text(e) + ")");
  throw Error(path + ": " + errno_text(e));
}

}  // namespace

SnapshotInfo create_snapshot(const std::string& dir, const std::string& archive, int zstd_level) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(dir + ": not a directory");
  std::vector<fs::path> entries;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::none, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    entries.push_back(it->path());
  if (ec) throw Error(dir + ": cannot list: " + ec.message());
  std::sort(entries.begin(), entries.end());

  std::string tmp = archive + ".tmp." + std::to_string(::getpid());
  Fd out{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (out.fd < 0) throw Error(tmp + ": " + errno_text(errno));
  SnapshotInfo info;
  try {
    write_all(out.fd, kMagic, 8, tmp);
    Deflater z(out.fd, tmp, zstd_level);
    std::vector<char> buf(1 << 20);
    for (const auto& p : entries) {
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0) throw Error(p.string() + ": " + errno_text(errno));
      uint8_t type = S_ISREG(st.st_mode) ? kFile : S_ISDIR(st.st_mode) ? kDir : S_ISLNK(st.st_mode) ? kSymlink : 0;
      if (type == 0) continue;                               // sockets, fifos, devices have no place in an environment
      std::string rel = p.lexically_relative(dir).string();  // fs::relative would follow symlinks
      std::string head;
      head.push_back(char(type));
      put_le(head, st.st_mode & 07777, 4);
      put_le(head, uint64_t(int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec), 8);
      put_le(head, rel.size(), 4);
      head += rel;
      if (type == kSymlink) {
        std::string target = fs::read_symlink(p, ec).string();
        if (ec) throw Error(p.string() + ": readlink: " + ec.message());
        put_le(head, target.size(), 8);
        head += target;
        put_le(head, crc32c(target.data(), target.size()), 4);
        z.add(head.data(), head.size());
        info.symlinks++;
      } else if (type == kDir) {
        put_le(head, 0, 8);
        put_le(head, crc32c(nullptr, 0), 4);
        z.add(head.data(), head.size());
        info.dirs++;
      } else {
        Fd in{::open(p.c_str(), O_RDONLY | O_CLOEXEC)};
        if (in.fd < 0) throw Error(p.string() + ": " + errno_text(errno));
        put_le(head, uint64_t(st.st_size), 8);
        z.add(head.data(), head.size());
        uint64_t left = uint64_t(st.st_size);
        uint32_t crc = 0;
        while (left > 0) {
          ssize_t r = ::read(in.fd, buf.data(), size_t(std::min<uint64_t>(left, buf.size())));
          if (r < 0 && errno == EINTR) continue;
          if (r <= 0) throw Error(p.string() + ": changed or unreadable while archiving");
          crc = crc32c_update(crc, buf.data(), size_t(r));
          z.add(buf.data(), size_t(r));
          left -= uint64_t(r);
        }
        std::string tail;
        put_le(tail, crc, 4);
        z.add(tail.data(), tail.size());
        info.files++;
        info.data_bytes += uint64_t(st.st_size);
      }
    }
    uint8_t end = kEndEntry;
    z.add(&end, 1);
    z.finish();
    std::string footer;
    put_le(footer, z.written(), 8);
    put_le(footer, z.raw(), 8);
    put_le(footer, z.crc(), 4);
    put_le(footer, info.files + info.dirs + info.symlinks, 4);
    footer.append(kEnd, 8);
    write_all(out.fd, footer.data(), footer.size(), tmp);
    if (::fsync(out.fd) != 0) throw Error(tmp + ": fsync: " + errno_text(errno));
    info.archive_bytes = 8 + z.written() + kFooter;
    if (::rename(tmp.c_str(), archive.c_str()) != 0) throw Corrupt(archive + ": rename: " + errno_text(errno));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  return info;
}

SnapshotInfo restore_snapshot(const std::string& archive, const std::string& dir) {
  Fd in{::open(archive.c_str(), O_RDONLY | O_CLOEXEC)};
  if (in.fd < 0) throw Error(archive + ": " + errno_text(errno));
  struct stat st {};
  ::fstat(in.fd, &st);
  uint64_t size = uint64_t(st.st_size);
  if (size < 8 + kFooter) throw Corrupt(archive + ": truncated (" + std::to_string(size) + " bytes)");
  unsigned char head[8], foot[kFooter];
  if (::pread(in.fd, head, 8, 0) != 8 || std::memcmp(head, kMagic, 8) != 0)
    throw Corrupt(archive + ": not a ballast snapshot (bad magic)");
  if (::pread(in.fd, foot, kFooter, off_t(size - kFooter)) != ssize_t(kFooter) || std::memcmp(foot + 24, kEnd, 8) != 0)
    throw Corrupt(archive + ": truncated (no footer)");
  uint64_t clen = get_le(foot, 8), raw = get_le(foot + 8, 8);
  auto want_crc = uint32_t(get_le(foot + 16, 4));
  auto want_count = uint32_t(get_le(foot + 20, 4));
  if (clen != size - 8 - kFooter)
    throw Corrupt(archive + ": truncated or padded (length in the footer does not match)");
  ::lseek(in.fd, 8, SEEK_SET);

  fs::path target = fs::absolute(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  std::string tmp = target.string() + ".ballast-restore." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(target.parent_path(), ec);
  if (::mkdir(tmp.c_str(), 0755) != 0) throw Error(tmp + ": " + errno_text(errno));
  SnapshotInfo info;
  try {
    Inflater z(in.fd, clen, archive);
    std::vector<char> buf(1 << 20);
    uint64_t consumed = 0;
    struct DirTime {
      std::string path;
      uint32_t mode;
    };
    std::vector<DirTime> dirs;
    for (;;) {
      uint8_t type = 0;
      z.read(&type, 1);
      consumed += 1;
      if (type == kEndEntry) break;
      if (type != kFile && type != kDir && type != kSymlink)
        throw Corrupt(archive + ": corrupted (entry type " + std::to_string(type) + ")");
      unsigned char fixed[16];
      z.read(fixed, 16);
      auto mode = uint32_t(get_le(fixed, 4)) & 07777;
      auto mtime = int64_t(get_le(fixed + 4, 8));
      auto plen = uint32_t(get_le(fixed + 12, 4));
      if (plen == 0 || plen > 4096) throw Corrupt(archive + ": corrupted (path length " + std::to_string(plen) + ")");
      std::string rel(plen, '\0');
      z.read(rel.data(), plen);
      if (!safe_relative(rel)) throw Corrupt(archive + ": unsafe path \"" + rel + "\" in the archive");
      unsigned char lenb[8];
      z.read(lenb, 8);
      uint64_t dlen = get_le(lenb, 8);
      consumed += 16 + plen + 8 + dlen + 4;
      if (consumed > raw) throw Corrupt(archive + ": corrupted (entry runs past the recorded length)");
      std::string path = tmp + "/" + rel;
      uint32_t crc = 0;
      if (type == kDir) {
        if (dlen != 0) throw Corrupt(archive + ": corrupted (directory with data)");
        if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) fail_create(archive, path);
        dirs.push_back({path, mode});
        info.dirs++;
      } else if (type == kSymlink) {
        if (dlen > 4096) throw Corrupt(archive + ": corrupted (symlink target length)");
        std::string target_s(size_t(dlen), '\0');
        z.read(target_s.data(), size_t(dlen));
        crc = crc32c(target_s.data(), target_s.size());
        if (::symlink(target_s.c_str(), path.c_str()) != 0) fail_create(archive, path);
        info.symlinks++;
      } else {
        Fd out{::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)};
        if (out.fd < 0) fail_create(archive, path);
        uint64_t left = dlen;
        while (left > 0) {
          size_t take = size_t(std::min<uint64_t>(left, buf.size()));
          z.read(buf.data(), take);
          crc = crc32c_update(crc, buf.data(), take);
          write_all(out.fd, buf.data(), take, path);
          left -= take;
        }
        ::fchmod(out.fd, mode);
        timespec times[2] = {{0, UTIME_OMIT}, {mtime / 1000000000, mtime % 1000000000}};
        ::futimens(out.fd, times);
        info.files++;
        info.data_bytes += dlen;
      }
      unsigned char crcb[4];
      z.read(crcb, 4);
      if (uint32_t(get_le(crcb, 4)) != crc) throw Corrupt(archive + ": corrupted (checksum of \"" + rel + "\")");
    }
    z.expect_end();
    if (z.crc() != want_crc) throw Corrupt(archive + ": corrupted (whole-archive checksum)");
    if (info.files + info.dirs + info.symlinks != want_count || consumed != raw)
      throw Corrupt(archive + ": corrupted (entry count or length differs from the footer)");
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) ::chmod(it->path.c_str(), it->mode);
    // Everything is verified: swap the new tree in, then drop the old one.
    std::string old = target.string() + ".ballast-old." + std::to_string(::getpid());
    bool had_old = fs::exists(target, ec);
    if (had_old && ::rename(target.c_str(), old.c_str()) != 0)
      throw Error(target.string() + ": cannot move aside: " + errno_text(errno));
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      int e = errno;
      if (had_old) ::rename(old.c_str(), target.c_str());
      throw Error(target.string() + ": rename: " + errno_text(e));
    }
    if (had_old) fs::remove_all(old, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  info.archive_bytes = size;
  return info;
}

std::string default_platform() {
  struct utsname u {};
  ::uname(&u);
  return std::string(u.sysname) + "-" + u.machine + "-glibc" + gnu_get_libc_version();
}

std::string environment_key(const std::vector<std::string>& lockfiles, const std::string& platform,
                            const std::string& dir) {
  Sha256 h;
  auto add = [&](const std::string& s) {
    uint64_t n = s.size();
    h.update(&n, sizeof n);  // length-prefixed: no two inputs concatenate alike
    h.update(s.data(), s.size());
  };
  add("ballast-env-v1");
  add(platform);
  add(fs::absolute(dir).lexically_normal().string());
  for (const auto& f : lockfiles) add(read_file(f));
  return h.hex().substr(0, 32);
}

std::vector<std::string> evict_snapshots(const std::string& store, uint64_t cap_bytes, const std::string& keep) {
  struct Item {
    std::string path;
    int64_t used_ns;
    uint64_t size;
  };
  std::vector<Item> items;
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(store, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (it->path().extension() != ".bsnap") continue;
    struct stat st {};
    if (::stat(it->path().c_str(), &st) != 0) continue;
    items.push_back(
        {it->path().string(), int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, uint64_t(st.st_size)});
    total += uint64_t(st.st_size);
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.used_ns < b.used_ns; });
  std::vector<std::string> removed;
  for (const auto& i : items) {
    if (total <= cap_bytes) break;
    if (fs::path(i.path).filename() == fs::path(keep).filename()) continue;
    if (::unlink(i.path.c_str()) == 0) {
      total -= i.size;
      removed.push_back(i.path);
    }
  }
  return removed;
}

int run_process(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env,
                const std::function<void(int)>& started) {
  if (argv.empty()) return 127;
  pid_t pid = ::fork();
  if (pid < 0) return 127;
  if (pid == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "ballast startup: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  if (started) started(pid);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

EnvResult run_env(const EnvOptions& o) {
  EnvResult r;
  const std::vector<std::pair<std::string, std::string>> env = {{"BALLAST_ENV_DIR", o.dir}};
  auto plain = [&](const std::string& why) {
    r.messages.push_back(why + "; running the install without a snapshot");
    r.exit_code = run_process(o.install, env);
    r.action = r.exit_code == 0 ? "installed" : "failed";
    return r;
  };
  if (o.lockfiles.empty()) return plain("no lockfile given");
  for (const auto& f : o.lockfiles) {
    FileId id;
    if (!file_id(f, id)) return plain("lockfile " + f + ": " + errno_text(errno));
  }
  try {
    r.key = environment_key(o.lockfiles, o.platform.empty() ? default_platform() : o.platform, o.dir);
  } catch (const Error& e) {
    return plain(e.what());
  }
  std::error_code ec;
  fs::create_directories(o.store, ec);
  std::string archive = o.store + "/" + r.key + ".bsnap";
  std::string lock_path = o.store + "/" + r.key + ".lock";
  Fd lock{::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)};
  if (lock.fd < 0) return plain("snapshot store " + o.store + ": " + errno_text(errno));
  // Held through restore or install+snapshot: concurrent builders of one key
  // wait here, then find the snapshot the first one published.
  while (::flock(lock.fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  if (::access(archive.c_str(), F_OK) == 0) {
    try {
      SnapshotInfo info = restore_snapshot(archive, o.dir);
      ::utimensat(AT_FDCWD, archive.c_str(), nullptr, 0);  // LRU: mark as used now
      r.action = "restored";
      r.bytes = info.data_bytes;
      return r;
    } catch (const Corrupt& e) {
      r.messages.push_back(std::string("ignoring snapshot: ") + e.what());
      ::unlink(archive.c_str());  // rebuilt below
    } catch (const Error& e) {
      // Not the archive's fault (a full disk, permissions): keep it for next time.
      r.messages.push_back(std::string("cannot restore snapshot: ") + e.what());
    }
  }
  r.exit_code = run_process(o.install, env);
  if (r.exit_code != 0) {
    r.action = "failed";
    r.messages.push_back("install exited with " + std::to_string(r.exit_code) + "; no snapshot taken");
    return r;
  }
  r.action = "installed";
  try {
    SnapshotInfo info = create_snapshot(o.dir, archive);
    r.action = "installed+snapshot";
    r.bytes = info.data_bytes;
    for (const auto& p : evict_snapshots(o.store, o.cap_bytes, archive)) r.messages.push_back("evicted " + p);
  } catch (const Error& e) {
    r.messages.push_back(std::string("snapshot not stored (the environment is installed): ") + e.what());
  }
  return r;
}

}  // namespace ballast::startup
