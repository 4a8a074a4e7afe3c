#include "hotblocks.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace ballast::startup {

uint64_t HotProfile::bytes() const {
  uint64_t total = 0;
  for (const auto& e : extents) total += e.length;
  return total;
}

HotProfile profile_from_access_log(const std::string& log_path, uint64_t block_bytes,
                                   const std::vector<std::string>& exclude) {
  if (block_bytes < 4096 || (block_bytes & (block_bytes - 1)) != 0)
    throw Error("block size must be a power of two >= 4096, not " + std::to_string(block_bytes));
  struct Event {
    int64_t t;
    uint64_t dev, ino, off, len;
    std::string path;
  };
  std::vector<Event> events;
  std::istringstream in(read_file(log_path));
  std::string line;
  while (std::getline(in, line)) {
    Event e;
    size_t pos = 0;
    bool ok = true;
    uint64_t* fields[] = {nullptr, &e.dev, &e.ino, &e.off, &e.len};
    for (int i = 0; i < 5 && ok; ++i) {
      size_t tab = line.find('\t', pos);
      if (tab == std::string::npos) {
        ok = false;
        break;
      }
      std::string f = line.substr(pos, tab - pos);
      char* end = nullptr;
      if (i == 0)
        e.t = std::strtoll(f.c_str(), &end, 10);
      else
        *fields[i] = std::strtoull(f.c_str(), &end, 10);
      ok = end != nullptr && *end == '\0' && !f.empty();
      pos = tab + 1;
    }
    if (!ok || pos >= line.size()) continue;  // a torn line of a killed process
    e.path = line.substr(pos);
    bool excluded = false;
    for (const auto& prefix : exclude) excluded |= !prefix.empty() && e.path.rfind(prefix, 0) == 0;
    if (!excluded) events.push_back(std::move(e));
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.t < b.t; });

  HotProfile p;
  p.block_bytes = block_bytes;
  std::map<std::pair<uint64_t, uint64_t>, int64_t> file_index;  // (dev, ino) -> index, -1 = left out
  std::set<std::pair<uint32_t, uint64_t>> seen;                 // (file, block)
  for (const auto& e : events) {
    auto key = std::make_pair(e.dev, e.ino);
    auto it = file_index.find(key);
    if (it == file_index.end()) {
      FileId id;
      int64_t idx = -1;
      // The file must still be the one the job read: same device and inode.
      if (file_id(e.path, id) && id.dev == e.dev && id.ino == e.ino) {
        idx = int64_t(p.files.size());
        p.files.push_back({e.path, id});
      }
      it = file_index.emplace(key, idx).first;
    }
    if (it->second < 0) continue;
    auto f = uint32_t(it->second);
    uint64_t size = p.files[f].id.size;
    if (e.off >= size) continue;
    uint64_t last = std::min(e.off + e.len, size) - 1;
    for (uint64_t b = e.off / block_bytes; b <= last / block_bytes; ++b) {
      if (!seen.insert({f, b}).second) continue;
      uint64_t off = b * block_bytes;
      uint64_t len = std::min(block_bytes, size - off);
      if (!p.extents.empty() && p.extents.back().file == f && p.extents.back().offset + p.extents.back().length == off)
        p.extents.back().length += len;
      else
        p.extents.push_back({f, off, len});
    }
  }
  return p;
}

void write_profile(const std::string& path, const HotProfile& p) {
  nlohmann::json j;
  j["format"] = "ballast-startup-hotblocks";
  j["version"] = 1;
  j["block_bytes"] = p.block_bytes;
  j["bytes"] = p.bytes();
  auto files = nlohmann::json::array();
  for (const auto& f : p.files)
    files.push_back(
        {{"path", f.path}, {"size", f.id.size}, {"mtime_ns", f.id.mtime_ns}, {"dev", f.id.dev}, {"ino", f.id.ino}});
  j["files"] = std::move(files);
  auto ext = nlohmann::json::array();
  for (const auto& e : p.extents) ext.push_back({e.file, e.offset, e.length});
  j["extents"] = std::move(ext);
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error(path + ": cannot write the profile");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    throw Error(path + ": " + errno_text(e));
  }
}

HotProfile read_profile(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path + ": not a JSON profile (byte " + std::to_string(e.byte) + ")");
  } catch (const nlohmann::json::out_of_range&) {
    throw Error(path + ": a number too large for a double");
  }
  auto fail = [&](const std::string& what) { return Error(path + ": " + what); };
  if (!j.is_object() || j.value("format", "") != "ballast-startup-hotblocks")
    throw fail("field \"format\" must be \"ballast-startup-hotblocks\"");
  if (j.value("version", 0) != 1) throw fail("field \"version\": only version 1 is known");
  HotProfile p;
  if (!j.contains("block_bytes") || !j["block_bytes"].is_number_unsigned())
    throw fail("field \"block_bytes\" must be a positive integer");
  p.block_bytes = j["block_bytes"].get<uint64_t>();
  if (!j.contains("files") || !j["files"].is_array()) throw fail("field \"files\" must be an array");
  size_t i = 0;
  for (const auto& f : j["files"]) {
    std::string where = "files[" + std::to_string(i++) + "]";
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string()) throw fail(where + ".path must be a string");
    HotFile h;
    h.path = f["path"].get<std::string>();
    for (const char* k : {"size", "dev", "ino"})
      if (!f.contains(k) || !f[k].is_number_unsigned()) throw fail(where + "." + k + " must be a non-negative integer");
    if (!f.contains("mtime_ns") || !f["mtime_ns"].is_number_integer())
      throw fail(where + ".mtime_ns must be an integer");
    h.id.size = f["size"].get<uint64_t>();
    h.id.dev = f["dev"].get<uint64_t>();
    h.id.ino = f["ino"].get<uint64_t>();
    h.id.mtime_ns = f["mtime_ns"].get<int64_t>();
    p.files.push_back(std::move(h));
  }
  if (!j.contains("extents") || !j["extents"].is_array()) throw fail("field \"extents\" must be an array");
  i = 0;
  for (const auto& e : j["extents"]) {
    std::string where = "extents[" + std::to_string(i++) + "]";
    if (!e.is_array() || e.size() != 3 || !e[0].is_number_unsigned() || !e[1].is_number_unsigned() ||
        !e[2].is_number_unsigned())
      throw fail(where + " must be [file_index, offset, length]");
    Extent x{e[0].get<uint32_t>(), e[1].get<uint64_t>(), e[2].get<uint64_t>()};
    if (x.file >= p.files.size()) throw fail(where + ": file index " + std::to_string(x.file) + " is out of range");
    if (x.offset + x.length > p.files[x.file].id.size || x.offset + x.length < x.offset)
      throw fail(where + ": extent runs past the recorded size of " + p.files[x.file].path);
    p.extents.push_back(x);
  }
  return p;
}

uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

namespace {

// Why a file no longer matches its profile entry, or "" when it does.
std::string mismatch(const FileId& want, const struct stat& st) {
  int64_t mtime = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (!S_ISREG(st.st_mode)) return "no longer a regular file";
  if (uint64_t(st.st_size) != want.size)
    return "size " + std::to_string(want.size) + " -> " + std::to_string(st.st_size);
  if (mtime != want.mtime_ns) return "modified since the profile (mtime differs)";
  if (uint64_t(st.st_ino) != want.ino || uint64_t(st.st_dev) != want.dev) return "replaced (inode differs)";
  return "";
}

}  // namespace

// Files are checked here with stat() and opened by the workers one at a
// time, so that a profile of many thousand files needs no more descriptors
// than there are workers.
Prefetcher::Prefetcher(const HotProfile& profile, const PrefetchOptions& options)
    : options_(options), files_(profile.files) {
  if (options_.threads == 0) options_.threads = 1;
  if (options_.io_bytes == 0) options_.io_bytes = 1 << 20;
  uint64_t budget = options_.budget_bytes;
  if (budget == 0) budget = mem_available_bytes() / 2;
  std::vector<bool> ok(files_.size(), false);
  for (size_t i = 0; i < files_.size(); ++i) {
    const HotFile& f = files_[i];
    struct stat st {};
    std::string why =
        ::stat(f.path.c_str(), &st) != 0 ? errno_text(errno) + " (vanished since the profile)" : mismatch(f.id, st);
    if (!why.empty()) {
      stats_.files_skipped++;
      stats_.messages.push_back("skip " + f.path + ": " + why);
      continue;
    }
    ok[i] = true;
    stats_.files_ok++;
  }
  uint64_t planned = 0;
  for (const auto& e : profile.extents) {
    if (!ok[e.file]) continue;
    if (planned >= budget) {
      stats_.budget_cut_bytes += e.length;
      continue;
    }
    uint64_t len = std::min(e.length, budget - planned);
    stats_.budget_cut_bytes += e.length - len;
    for (uint64_t off = 0; off < len; off += options_.io_bytes)
      pieces_.push_back({e.file, e.offset + off, std::min(options_.io_bytes, len - off)});
    planned += len;
  }
  stats_.planned_bytes = planned;
}

Prefetcher::~Prefetcher() {
  stop();
  wait();
}

std::vector<std::pair<uint64_t, uint64_t>> open_files_of(int pid) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  std::vector<int> todo = {pid};
  std::set<int> visited;
  while (!todo.empty()) {
    int p = todo.back();
    todo.pop_back();
    if (!visited.insert(p).second) continue;
    std::string base = "/proc/" + std::to_string(p);
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator(base + "/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      struct stat st {};
      if (::stat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) out.emplace_back(st.st_dev, st.st_ino);
    }
    for (auto it = std::filesystem::directory_iterator(base + "/task", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      std::ifstream children(it->path() / "children");
      int child;
      while (children >> child) todo.push_back(child);
    }
  }
  return out;
}

RelevanceCheck::RelevanceCheck(const std::vector<HotFile>& files, size_t limit) : limit_(limit) {
  for (const auto& f : files) profile_.insert({f.id.dev, f.id.ino});
}

RelevanceCheck::Verdict RelevanceCheck::observe(const std::vector<std::pair<uint64_t, uint64_t>>& open) {
  for (const auto& id : open) {
    if (verdict_ != kUndecided) break;
    if (profile_.count(id))
      verdict_ = kRelevant;
    else
      seen_.insert(id);
  }
  if (verdict_ == kUndecided && seen_.size() >= limit_) verdict_ = kWrongProfile;
  return verdict_;
}

namespace {

// The program a process runs ("self" for this one); empty once it is gone.
std::string exe_of(const std::string& pid) {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/" + pid + "/exe", ec).string();
}

}  // namespace

void Prefetcher::watch(int pid, size_t limit) {
  if (watcher_.joinable()) return;
  watcher_ = std::thread([this, pid, limit] {
    RelevanceCheck check(files_, limit);
    const std::string self = exe_of("self");
    while (!stop_.load() && next_.load() < pieces_.size()) {
      // Between fork and exec the job is a copy of this process and holds the
      // profile's files that the workers have open: not yet its own files.
      if (exe_of(std::to_string(pid)) == self) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      switch (check.observe(open_files_of(pid))) {
        case RelevanceCheck::kRelevant:
          return;
        case RelevanceCheck::kWrongProfile:
          watch_message_ = "stopped: the job opened " + std::to_string(check.seen()) +
                           " files and none is in the profile (a profile of another job?)";
          stop_.store(true);
          return;
        case RelevanceCheck::kUndecided:
          break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
}

void Prefetcher::start() {
  unsigned n = std::min<size_t>(options_.threads, std::max<size_t>(pieces_.size(), 1));
  running_.store(n);
  for (unsigned i = 0; i < n; ++i)
    threads_.emplace_back([this] {
      worker();
      running_.fetch_sub(1);
    });
}

void Prefetcher::stop() { stop_.store(true); }

void Prefetcher::wait() {
  for (auto& t : threads_) t.join();
  threads_.clear();
  stop_.store(true);  // ends the watcher, if any
  if (watcher_.joinable()) watcher_.join();
  if (!watch_message_.empty()) {
    stats_.messages.push_back(watch_message_);
    watch_message_.clear();
  }
  stats_.done_bytes = done_bytes_.load();
  stats_.errors = errors_.load();
  stats_.stopped_early = next_.load() < pieces_.size();
}

void Prefetcher::worker() {
  std::unique_ptr<char[]> buf(new char[options_.io_bytes]);
  int64_t open_file = -1;  // the file fd belongs to (fd is -1 when it failed to open)
  int fd = -1;
  while (!stop_.load(std::memory_order_relaxed)) {
    size_t i = next_.fetch_add(1);
    if (i >= pieces_.size()) break;
    const Piece& p = pieces_[i];
    if (open_file != int64_t(p.file)) {
      if (fd >= 0) ::close(fd);
      fd = ::open(files_[p.file].path.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st {};
      // Checked again on the descriptor: the file may change after the plan.
      if (fd >= 0 && (::fstat(fd, &st) != 0 || !mismatch(files_[p.file].id, st).empty())) {
        ::close(fd);
        fd = -1;
      }
      open_file = p.file;
    }
    if (fd < 0) {
      errors_.fetch_add(1);
      continue;
    }
    // A plain pread puts the pages in the page cache and, unlike readahead(2)
    // or WILLNEED, returns only when they are there: first-need order holds.
    ssize_t n = ::pread(fd, buf.get(), p.length, off_t(p.offset));
    if (n < 0)
      errors_.fetch_add(1);
    else
      done_bytes_.fetch_add(uint64_t(n));
  }
  if (fd >= 0) ::close(fd);
}

}  // namespace ballast::startup
