#include "heartbeat.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>
#include <tuple>

namespace ballast::hang {

namespace {

int64_t wall_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string seconds_ago(int64_t ns) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", double(ns) / 1e9);
  return b;
}

template <class T>
bool number(const std::string& s, T* out) {
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool read_file(const std::string& path, std::string* out, size_t cap) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  out->assign(cap, '\0');
  const ssize_t n = pread(fd, out->data(), cap, 0);
  close(fd);
  if (n < 0) return false;
  out->resize(size_t(n));
  return true;
}

}  // namespace

uint32_t fnv1a32(const char* data, size_t n) {
  uint32_t h = 0x811C9DC5u;
  for (size_t i = 0; i < n; ++i) h = (h ^ uint8_t(data[i])) * 0x01000193u;
  return h;
}

bool parse_heartbeat(const std::string& text, Heartbeat* out, std::string* err) {
  if (text.size() != kHeartbeatSize || text.back() != '\n') {
    *err = std::to_string(text.size()) + " bytes, not a heartbeat line of " + std::to_string(kHeartbeatSize);
    return false;
  }
  const size_t sum_at = text.rfind(" sum=");
  if (sum_at == std::string::npos) {
    *err = "field sum is missing";
    return false;
  }
  uint32_t sum = 0;
  std::string hexsum = text.substr(sum_at + 5);
  while (!hexsum.empty() && (hexsum.back() == ' ' || hexsum.back() == '\n')) hexsum.pop_back();
  const auto [p, ec] = std::from_chars(hexsum.data(), hexsum.data() + hexsum.size(), sum, 16);
  if (ec != std::errc() || p != hexsum.data() + hexsum.size() || sum != fnv1a32(text.data(), sum_at)) {
    *err = "field sum does not match the line (a torn update?)";
    return false;
  }
  std::istringstream in(text.substr(0, sum_at));
  std::string kv;
  Heartbeat h;
  bool magic = false;
  std::string host;
  while (in >> kv) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      *err = "'" + kv + "' is not key=value";
      return false;
    }
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    bool ok = true;
    if (k == "ballast-heartbeat")
      ok = magic = v == "1";
    else if (k == "rank")
      ok = number(v, &h.rank) && h.rank >= 0 && h.rank < 1 << 20;
    else if (k == "world")
      ok = number(v, &h.world) && h.world >= 0 && h.world < 1 << 20;
    else if (k == "pid")
      ok = number(v, &h.pid) && h.pid > 0;
    else if (k == "host")
      host = v;
    else if (k == "beat")
      ok = number(v, &h.beat);
    else if (k == "step")
      ok = number(v, &h.step);
    else if (k == "phase")
      h.phase = v;
    else if (k == "comm") {
      ok = v == "0" || v == "1";
      h.comm = v == "1";
    } else if (k == "wall_ns")
      ok = number(v, &h.wall_ns);
    else if (k == "stack_signal")
      ok = number(v, &h.stack_signal) && h.stack_signal >= 0 && h.stack_signal < 65;
    else if (k == "state") {
      ok = v == "running" || v == "done" || v == "failed";
      h.done = v == "done";
      h.failed = v == "failed";
    }
    if (!ok) {
      *err = "field " + k + " is '" + v + "'";
      return false;
    }
  }
  if (!magic || h.rank < 0 || h.pid <= 0) {
    *err = !magic ? "field ballast-heartbeat is not 1" : "field rank or pid is missing";
    return false;
  }
  h.state = probe(h.pid, host.c_str());
  h.host = host;
  *out = std::move(h);
  return true;
}

std::vector<Heartbeat> read_heartbeats(const std::string& dir, std::vector<std::string>* errors) {
  DIR* d = opendir(dir.c_str());
  if (!d) return {};
  const std::string suffix = ".heartbeat";
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  std::map<int, Heartbeat> newest;
  for (const auto& name : names) {
    const std::string path = dir + "/" + name;
    Heartbeat h;
    std::string err = "cannot read: " + std::string(std::strerror(errno));
    bool ok = false;
    for (int attempt = 0; attempt < 3 && !ok; ++attempt) {  // a torn update reads right the next time
      std::string text;
      if (!read_file(path, &text, kHeartbeatSize + 1)) {
        err = std::string("cannot read: ") + std::strerror(errno);
        break;
      }
      ok = parse_heartbeat(text, &h, &err);
    }
    if (!ok) {
      errors->push_back(path + ": " + err);
      continue;
    }
    h.path = path;
    auto [it, fresh] = newest.try_emplace(h.rank, h);
    if (!fresh && h.wall_ns > it->second.wall_ns) it->second = h;  // a restart of the rank
  }
  std::vector<Heartbeat> out;
  for (auto& [rank, h] : newest) out.push_back(std::move(h));
  return out;
}

uint64_t heartbeat_signature(const std::vector<Heartbeat>& beats) {
  uint64_t h = 1469598103934665603ULL;
  for (const auto& b : beats) h = (h ^ (b.beat * 1000003u + uint64_t(b.pid))) * 1099511628211ULL;
  return h;
}

bool heartbeats_running(const std::vector<Heartbeat>& beats) {
  bool started = false, open = false;
  for (const auto& b : beats) {
    started = started || b.beat > 0;
    open = open || !b.done;
  }
  return started && open;
}

Verdict analyze_heartbeats(const std::vector<Heartbeat>& beats, const std::map<int, ProcState>& states) {
  Verdict v;
  v.ranks = int(beats.size());
  if (beats.empty()) return v;
  auto state_of = [&](const Heartbeat& b) {
    const auto it = states.find(b.rank);
    return it != states.end() ? it->second : b.state;
  };
  int64_t max_step = INT64_MIN;
  bool anyone_in_comm = false;
  for (const auto& b : beats) {
    max_step = std::max(max_step, b.step);
    anyone_in_comm = anyone_in_comm || (b.comm && !b.done);
    v.last_progress_ns = std::max(v.last_progress_ns, b.wall_ns);
  }
  v.seq = uint64_t(std::max<int64_t>(max_step, 0));
  for (const auto& b : beats)
    if (b.comm && b.step == max_step) v.op = b.phase;
  auto where = [](const Heartbeat& b) {
    return "step " + std::to_string(b.step) + (b.phase != "-" ? " in " + b.phase : " between phases") + ", last beat " +
           seconds_ago(wall_now() - b.wall_ns) + " ago";
  };
  const std::string others = anyone_in_comm ? "the others wait in " + (v.op.empty() ? "a collective" : v.op) +
                                                  " of step " + std::to_string(max_step)
                                            : "the others are at step " + std::to_string(max_step);
  // 1. Processes gone or stopped. Of several gone, those that failed inside
  // a collective were held up by the one gone outside it (a peer's death
  // ends the collective with an error): the first named is the rank gone
  // without a word (killed), then one that failed on its own error, outside
  // a collective, earliest first.
  std::vector<const Heartbeat*> gone;
  for (const auto& b : beats) {
    const ProcState st = state_of(b);
    const std::string pid = "pid " + std::to_string(b.pid);
    if (st == ProcState::gone && !b.done)
      gone.push_back(&b);
    else if (st == ProcState::stopped)
      v.causes.push_back(
          {b.rank, "stuck", "process " + pid + " is stopped (SIGSTOP or a debugger) at " + where(b) + "; " + others});
  }
  std::stable_sort(gone.begin(), gone.end(), [](const Heartbeat* a, const Heartbeat* b) {
    return std::make_tuple(a->failed, a->comm, a->wall_ns) < std::make_tuple(b->failed, b->comm, b->wall_ns);
  });
  for (const Heartbeat* b : gone) {
    const bool held_up = b->comm && !(gone.front()->comm);
    if (b != gone.front() && (held_up || b->failed)) continue;
    v.causes.push_back({b->rank, b->failed ? "failed" : "crashed",
                        "process pid " + std::to_string(b->pid) +
                            (b->failed ? " ended on an error of its own" : " is gone without finishing") + ", at " +
                            where(*b) + "; " + others});
  }
  if (!v.causes.empty()) {
    v.verdict = "hang";
    return v;
  }
  // 2. Ranks behind, or outside the collective the others wait in: what
  // they do (busy, sleeping and where) for the evidence.
  std::vector<const Heartbeat*> lagging;
  for (const auto& b : beats)
    if (!b.done && (b.step < max_step || (anyone_in_comm && !b.comm))) lagging.push_back(&b);
  std::vector<int32_t> pids;
  for (const Heartbeat* b : lagging) pids.push_back(b->pid);
  const auto doing = activity_of(pids, std::chrono::milliseconds(100));
  for (const Heartbeat* b : lagging) {
    const auto d = doing.find(b->pid);
    const std::string what = d != doing.end() ? d->second : proc_state_name(state_of(*b));
    v.causes.push_back(
        {b->rank, "not_joined",
         "process pid " + std::to_string(b->pid) + " is " + what + " at " + where(*b) + ", " +
             (b->step < max_step ? "behind step " + std::to_string(max_step) : "outside the collective") + "; " +
             others});
  }
  v.verdict = "hang";
  if (!v.causes.empty()) return v;
  // 3. Everyone in the same place: the rank whose last beat is oldest.
  const Heartbeat* first = nullptr;
  for (const auto& b : beats)
    if (!b.done && (!first || b.wall_ns < first->wall_ns)) first = &b;
  if (!first) {
    v.verdict = "healthy";
    return v;
  }
  v.causes.push_back({first->rank, "slow",
                      "its progress stopped first, at " + where(*first) + ", while its process is " +
                          proc_state_name(state_of(*first))});
  return v;
}

std::map<int, std::string> collect_stacks(const std::string& dir, const std::vector<Heartbeat>& beats, int wait_ms) {
  std::map<int, std::string> out;
  std::map<int, std::string> paths;
  for (const auto& b : beats) {
    if (b.done || b.failed) continue;
    if (b.state == ProcState::gone)
      out[b.rank] = "(no stack: the process is gone)";
    else if (b.state == ProcState::stopped)
      out[b.rank] = "(no stack: the process is stopped and cannot run its handler)";
    else if (b.state != ProcState::alive)
      out[b.rank] = "(no stack: the process is not on this host)";
    else if (b.stack_signal <= 0)
      out[b.rank] = "(no stack: the process installed no stack signal)";
    else {
      const std::string path = dir + "/rank-" + std::to_string(b.rank) + "." + std::to_string(b.pid) + ".stack";
      if (truncate(path.c_str(), 0) != 0 || kill(b.pid, b.stack_signal) != 0) {
        out[b.rank] = "(no stack: " + path + ": " + std::strerror(errno) + ")";
        continue;
      }
      paths[b.rank] = path;
    }
  }
  // Each dump is written by the process's own signal handler: read each file
  // once it stopped growing for 50 ms.
  std::map<int, std::pair<off_t, int>> seen;  // rank -> (size, ms stable)
  for (int ms = 0; ms < wait_ms && !paths.empty(); ms += 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (auto it = paths.begin(); it != paths.end();) {
      struct stat st {};
      const off_t size = stat(it->second.c_str(), &st) == 0 ? st.st_size : 0;
      auto& [last, stable] = seen[it->first];
      stable = size > 0 && size == last ? stable + 10 : 0;
      last = size;
      if (stable >= 50) {
        std::string text;
        read_file(it->second, &text, 64 * 1024);
        out[it->first] = text;
        it = paths.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& [rank, path] : paths)
    out[rank] = "(no stack within " + std::to_string(wait_ms) + " ms: " + path + ")";
  return out;
}

}  // namespace ballast::hang
