#include "rings.hpp"

#include "proc_stat.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

namespace ballast::hang {

const char* proc_state_name(ProcState s) {
  switch (s) {
    case ProcState::alive:
      return "alive";
    case ProcState::stopped:
      return "stopped";
    case ProcState::gone:
      return "gone";
    default:
      return "unknown";
  }
}

namespace {

bool on_this_host(const char* host) {
  char me[256] = {0};
  gethostname(me, sizeof me - 1);
  return host && std::strncmp(me, host, 63) == 0;
}

// The state letter of pid in /proc/PID/stat (0 when it cannot be read) and
// the CPU time of all its threads, in clock ticks.
char read_stat(int32_t pid, uint64_t* cpu_ticks) {
  util::ProcStat s;
  if (!util::read_proc_stat(pid, &s)) return 0;
  *cpu_ticks = s.utime + s.stime;
  return s.state;
}

}  // namespace

ProcState probe(int32_t pid, const char* host) {
  if (!on_this_host(host) || pid <= 0) return ProcState::unknown;
  uint64_t ticks = 0;
  const char st = read_stat(pid, &ticks);
  if (st == 'Z' || st == 'X' || st == 0) return ProcState::gone;
  if (st == 'T' || st == 't') return ProcState::stopped;
  return ProcState::alive;
}

std::map<int32_t, std::string> activity(const std::vector<const RankRing*>& rings, std::chrono::milliseconds window) {
  std::vector<int32_t> pids;
  for (const RankRing* r : rings)
    if (on_this_host(r->header.host) && r->header.pid > 0) pids.push_back(r->header.pid);
  return activity_of(pids, window);
}

namespace {

// Where a sleeping process waits in the kernel (/proc/PID/wchan: the
// function, "futex_wait_queue", "do_epoll_wait", "hrtimer_nanosleep"), or "".
std::string wchan(int32_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/wchan", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return "";
  char buf[128] = {0};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  std::string w(buf, n);
  return w == "0" ? "" : w;
}

// The time all of pid's threads waited on a run queue, in ns: the second
// field of /proc/PID/task/TID/schedstat. False where the kernel keeps no
// such statistics.
bool run_queue_ns(int32_t pid, uint64_t* ns) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR* dir = opendir(path);
  if (!dir) return false;
  uint64_t sum = 0;
  bool any = false;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    char stat[320];
    std::snprintf(stat, sizeof stat, "/proc/%d/task/%s/schedstat", pid, e->d_name);
    FILE* f = std::fopen(stat, "r");
    if (!f) continue;
    unsigned long long ran = 0, waited = 0;
    if (std::fscanf(f, "%llu %llu", &ran, &waited) == 2) {
      sum += waited;
      any = true;
    }
    std::fclose(f);
  }
  closedir(dir);
  *ns = sum;
  return any;
}

struct Sample {
  char state = 0;  // 0: unreadable
  uint64_t cpu_ticks = 0;
  bool has_queued = false;
  uint64_t queued_ns = 0;
};

Sample sample(int32_t pid) {
  Sample s;
  s.state = read_stat(pid, &s.cpu_ticks);
  s.has_queued = s.state && run_queue_ns(pid, &s.queued_ns);
  return s;
}

}  // namespace

std::map<int32_t, std::string> activity_of(const std::vector<int32_t>& pids, std::chrono::milliseconds window) {
  // The window runs from before the first sample to after the last, so that
  // what was counted between them fits in it however long the reads take.
  const auto t0 = std::chrono::steady_clock::now();
  std::map<int32_t, Sample> before;
  for (const int32_t pid : pids)
    if (pid > 0)
      if (const Sample s = sample(pid); s.state) before[pid] = s;
  std::map<int32_t, std::string> out;
  if (before.empty()) return out;
  std::this_thread::sleep_for(window);
  std::map<int32_t, Sample> after;
  for (const auto& [pid, s0] : before) after[pid] = sample(pid);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  const long hz = sysconf(_SC_CLK_TCK);
  for (const auto& [pid, s0] : before) {
    const Sample& s1 = after[pid];
    const std::string last = " in the last " + std::to_string(ms) + " ms";
    if (s1.state == 0 || s1.state == 'Z' || s1.state == 'X')
      out[pid] = "gone";
    else if (s1.state == 'T' || s1.state == 't')
      out[pid] = "stopped";
    else {
      // Busy from a quarter of the window on, counting the time it waited
      // for a CPU: an endless loop takes a whole core on an idle host, and
      // on a loaded one waits on the run queue for most of what it does not
      // get, while a sleeping process's helper threads (a communication
      // library's poll loop, a heartbeat writer) run a moment now and then.
      const uint64_t cpu_ms = (s1.cpu_ticks - s0.cpu_ticks) * 1000 / uint64_t(hz);
      const std::string cpu = cpu_ms == 0 ? "no CPU" : std::to_string(cpu_ms) + " ms of CPU";
      const uint64_t queued_ms =
          s0.has_queued && s1.has_queued && s1.queued_ns > s0.queued_ns ? (s1.queued_ns - s0.queued_ns) / 1000000 : 0;
      if (cpu_ms * 4 >= uint64_t(ms)) {
        out[pid] = "busy (" + cpu + last + ")";
      } else if ((cpu_ms + queued_ms) * 4 >= uint64_t(ms)) {
        out[pid] = "busy (" + cpu + " and " + std::to_string(queued_ms) + " ms waiting for one" + last + ")";
      } else {
        const std::string w = wchan(pid);
        out[pid] = "sleeping (" + cpu + last + (w.empty() ? "" : ", waiting in the kernel at " + w) + ")";
      }
    }
  }
  return out;
}

bool read_ring(const std::string& path, RankRing* out, std::string* err) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *err = path + ": cannot open: " + std::strerror(errno);
    return false;
  }
  struct stat st {};
  fstat(fd, &st);
  const size_t size = size_t(st.st_size);
  if (size < sizeof(ballast_trace_header)) {
    close(fd);
    *err = path + ": " + std::to_string(size) + " bytes is shorter than a trace header (256)";
    return false;
  }
  void* mem = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (mem == MAP_FAILED) {
    *err = path + ": cannot map: " + std::strerror(errno);
    return false;
  }
  const auto* h = static_cast<const ballast_trace_header*>(mem);
  out->path = path;
  out->header = *h;
  const ballast_trace_header& hd = out->header;
  std::string bad;
  if (hd.magic != BALLAST_TRACE_MAGIC)
    bad = "field magic is not a Ballast trace ring";
  else if (hd.version != BALLAST_TRACE_VERSION)
    bad = "field version is " + std::to_string(hd.version) + ", this reader knows 1";
  else if (hd.slot_size != sizeof(ballast_trace_slot))
    bad = "field slot_size is " + std::to_string(hd.slot_size) + ", expected 192";
  else if (hd.header_size < sizeof(ballast_trace_header))
    bad = "field header_size is " + std::to_string(hd.header_size);
  else if (hd.slot_count == 0 || (hd.slot_count & (hd.slot_count - 1)) != 0)
    bad = "field slot_count " + std::to_string(hd.slot_count) + " is not a power of two";
  else if (!(hd.ns_per_tick > 0))
    bad = "field ns_per_tick is " + std::to_string(hd.ns_per_tick) + ", not positive";
  else if (hd.nranks < 0 || hd.rank < -1 || (hd.nranks > 0 && hd.rank >= hd.nranks))  // -1 and 0: unknown
    bad = "field rank " + std::to_string(hd.rank) + " is outside a world of " + std::to_string(hd.nranks);
  else if (size < size_t(hd.header_size) + size_t(hd.slot_count) * hd.slot_size)
    bad =
        "the file (" + std::to_string(size) + " bytes) is shorter than its " + std::to_string(hd.slot_count) + " slots";
  if (!bad.empty()) {
    munmap(mem, size);
    *err = path + ": " + bad;
    return false;
  }
  const auto* slots = reinterpret_cast<const ballast_trace_slot*>(static_cast<const char*>(mem) + hd.header_size);
  // Skipped first: every index it counts was claimed before the head read.
  const uint64_t skipped = __atomic_load_n(&h->skipped, __ATOMIC_ACQUIRE);
  const uint64_t head = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
  const uint64_t used = std::min<uint64_t>(head, hd.slot_count);
  out->overflow = head > skipped + used ? head - skipped - used : 0;
  out->dropped = __atomic_load_n(&h->dropped, __ATOMIC_RELAXED);
  // Slot by slot: besides the last slot_count claims, the ring keeps older
  // records still in flight (its writers go round them).
  std::vector<std::pair<uint64_t, ballast_trace_slot>> found;
  found.reserve(size_t(used));
  for (uint64_t k = 0; k < used; ++k) {
    const ballast_trace_slot* s = slots + k;
    for (int attempt = 0; attempt < 3; ++attempt) {
      const uint64_t g1 = __atomic_load_n(&s->gen, __ATOMIC_ACQUIRE);
      if (g1 == 0 || g1 > head || ((g1 - 1) & (hd.slot_count - 1)) != k) break;  // being written, or not a record here
      ballast_trace_slot copy;
      std::memcpy(&copy, s, sizeof copy);
      __atomic_thread_fence(__ATOMIC_ACQUIRE);
      if (__atomic_load_n(&s->gen, __ATOMIC_RELAXED) == g1) {
        found.emplace_back(g1 - 1, copy);
        break;
      }
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  out->records.clear();
  out->records.reserve(found.size());
  for (const auto& f : found) out->records.push_back(f.second);
  munmap(mem, size);
  out->header.host[sizeof out->header.host - 1] = '\0';
  out->state = probe(hd.pid, out->header.host);
  return true;
}

RankRing merge_rings(std::vector<RankRing> parts) {
  if (parts.size() == 1) return std::move(parts.front());
  RankRing out = std::move(parts.front());
  // A tick of another writer's clock on out's clock; 0 stays 0 (not yet).
  auto rebase = [&out](const RankRing& from, uint64_t tick) -> uint64_t {
    if (tick == 0) return 0;
    return out.header.clock_tick +
           uint64_t(int64_t(double(from.wall_ns(tick) - out.header.clock_wall_ns) / out.header.ns_per_tick));
  };
  for (size_t p = 1; p < parts.size(); ++p) {
    const RankRing& r = parts[p];
    out.path += ", " + r.path;
    out.overflow += r.overflow;
    out.dropped += r.dropped;
    out.header.head += r.header.head;
    out.header.closed = out.header.closed && r.header.closed;
    out.header.heartbeat_tick = std::max(out.header.heartbeat_tick, rebase(r, r.header.heartbeat_tick));
    for (ballast_trace_slot s : r.records) {
      s.issue_tick = rebase(r, s.issue_tick);
      s.start_tick = rebase(r, s.start_tick);
      s.end_tick = rebase(r, s.end_tick);
      s.progress_tick = rebase(r, s.progress_tick);
      out.records.push_back(s);
    }
  }
  // Oldest first by issue, or by start for a writer that leaves the issue unset.
  auto when = [](const ballast_trace_slot& s) { return s.issue_tick ? s.issue_tick : s.start_tick; };
  std::stable_sort(out.records.begin(), out.records.end(),
                   [&when](const ballast_trace_slot& a, const ballast_trace_slot& b) { return when(a) < when(b); });
  return out;
}

std::vector<RankRing> read_dir(const std::string& dir, std::vector<std::string>* errors) {
  std::map<int32_t, std::map<int32_t, std::vector<RankRing>>> files;  // rank -> pid -> its rings
  DIR* d = opendir(dir.c_str());
  if (!d) {
    errors->push_back(dir + ": cannot open the directory: " + std::strerror(errno));
    return {};
  }
  const std::string suffix = BALLAST_TRACE_SUFFIX;
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());  // the same merge order whatever readdir's
  for (const auto& name : names) {
    RankRing r;
    std::string err;
    if (!read_ring(dir + "/" + name, &r, &err)) {
      errors->push_back(err);
      continue;
    }
    files[r.header.rank][r.header.pid].push_back(std::move(r));
  }
  std::vector<RankRing> out;
  for (auto& [rank, by_pid] : files) {
    // The newest process of the rank: the one whose newest ring is newest.
    auto newest = [](const std::vector<RankRing>& rs) {
      int64_t t = INT64_MIN;
      for (const auto& r : rs) t = std::max(t, r.header.clock_wall_ns);
      return t;
    };
    auto best = by_pid.begin();
    for (auto it = by_pid.begin(); it != by_pid.end(); ++it)
      if (newest(it->second) > newest(best->second)) best = it;
    out.push_back(merge_rings(std::move(best->second)));
  }
  return out;
}

}  // namespace ballast::hang
