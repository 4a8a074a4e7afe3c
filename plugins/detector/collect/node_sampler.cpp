#include "node_sampler.hpp"

#include "proc_stat.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>

namespace ballast::collect {

namespace {

bool slurp(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  return true;
}

// "key value" or "key: value" lines into a map (first number after the key).
std::unordered_map<std::string, double> key_values(const std::string& text) {
  std::unordered_map<std::string, double> kv;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    size_t sp = line.find_first_of(" \t:");
    if (sp == std::string::npos) continue;
    std::string key = line.substr(0, sp);
    const char* p = line.c_str() + sp;
    while (*p == ' ' || *p == '\t' || *p == ':') ++p;
    char* e = nullptr;
    double v = std::strtod(p, &e);
    if (e != p) kv.emplace(key, v);
  }
  return kv;
}

bool is_number(const char* s) {
  if (!*s) return false;
  for (; *s; ++s)
    if (*s < '0' || *s > '9') return false;
  return true;
}

}  // namespace

NodeSampler::NodeSampler(NodeOptions options)
    : options_(std::move(options)), ticks_per_s_(sysconf(_SC_CLK_TCK)), page_size_(sysconf(_SC_PAGESIZE)) {}

int NodeSampler::sample(int64_t ts, std::vector<Sample>* out) {
  int failed = 0;
  if (options_.system) {
    system_cpu(ts, out, &failed);
    memory_load(out, &failed);
    disks(ts, out, &failed);
  }
  if (options_.system || options_.net_pid) network(ts, out, &failed);
  if (!options_.pids.empty() || !options_.process_name.empty() || !options_.cgroups.empty())
    processes(ts, out, &failed);
  for (const auto& dir : options_.cgroups) cgroup(dir, ts, out);
  rates_.sweep();
  return failed;
}

void NodeSampler::system_cpu(int64_t ts, std::vector<Sample>* out, int* failed) {
  std::string text;
  if (!slurp(options_.proc_root + "/stat", &text)) {
    ++*failed;
    return;
  }
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu ", 0) == 0) {
      double f[10] = {};
      std::sscanf(line.c_str() + 4, "%lf %lf %lf %lf %lf %lf %lf %lf %lf %lf", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5],
                  &f[6], &f[7], &f[8], &f[9]);
      // user nice system idle iowait irq softirq steal guest guest_nice;
      // guest time is already counted in user.
      double cur[6] = {f[0] + f[1], f[2] + f[5] + f[6], f[4], f[7], f[3], 0};
      for (int k = 0; k < 8; ++k) cur[5] += f[k];
      double dt = cur[5] - prev_cpu_[5];
      if (have_cpu_ && dt > 0) {
        const char* names[5] = {"cpu.user", "cpu.system", "cpu.iowait", "cpu.steal", "cpu.idle"};
        for (int k = 0; k < 5; ++k) add_gauge(out, names[k], 100.0 * std::max(0.0, cur[k] - prev_cpu_[k]) / dt);
      }
      std::copy(cur, cur + 6, prev_cpu_);
      have_cpu_ = true;
    } else if (line.rfind("ctxt ", 0) == 0) {
      rates_.add(out, "ctxt", std::strtod(line.c_str() + 5, nullptr), ts);
    } else if (line.rfind("procs_running ", 0) == 0) {
      add_gauge(out, "procs.running", std::strtod(line.c_str() + 14, nullptr));
    } else if (line.rfind("procs_blocked ", 0) == 0) {
      add_gauge(out, "procs.blocked", std::strtod(line.c_str() + 14, nullptr));
    }
  }
}

void NodeSampler::memory_load(std::vector<Sample>* out, int* failed) {
  std::string text;
  if (slurp(options_.proc_root + "/meminfo", &text)) {
    auto kv = key_values(text);
    double total = kv["MemTotal"] * 1024, avail = kv["MemAvailable"] * 1024;
    add_gauge(out, "mem.total_bytes", total);
    add_gauge(out, "mem.available_bytes", avail);
    add_gauge(out, "mem.used_bytes", total - avail);
  } else {
    ++*failed;
  }
  if (slurp(options_.proc_root + "/loadavg", &text)) {
    double l[3] = {};
    if (std::sscanf(text.c_str(), "%lf %lf %lf", &l[0], &l[1], &l[2]) == 3) {
      add_gauge(out, "load.1", l[0]);
      add_gauge(out, "load.5", l[1]);
      add_gauge(out, "load.15", l[2]);
    }
  } else {
    ++*failed;
  }
}

void NodeSampler::disks(int64_t ts, std::vector<Sample>* out, int* failed) {
  std::string text;
  if (!slurp(options_.proc_root + "/diskstats", &text)) {
    ++*failed;
    return;
  }
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    unsigned major = 0, minor = 0;
    char name[64];
    double f[11] = {};
    if (std::sscanf(line.c_str(), "%u %u %63s %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf", &major, &minor, name, &f[0],
                    &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8], &f[9], &f[10]) < 14)
      continue;
    std::string dev = name;
    // Whole disks only (partitions double-count), and no idle loop/ram devices.
    if (dev.rfind("loop", 0) == 0 || dev.rfind("ram", 0) == 0) continue;
    if (access(("/sys/block/" + dev).c_str(), F_OK) != 0) continue;
    std::string p = "disk." + dev + ".";
    rates_.add(out, p + "read_ops", f[0], ts);
    rates_.add(out, p + "read_bytes", f[2], ts, 512.0);
    rates_.add(out, p + "write_ops", f[4], ts);
    rates_.add(out, p + "write_bytes", f[6], ts, 512.0);
    rates_.add(out, p + "busy", f[9], ts, 1e-3);
  }
}

void NodeSampler::network(int64_t ts, std::vector<Sample>* out, int* failed) {
  std::string base =
      options_.proc_root + (options_.net_pid ? "/" + std::to_string(options_.net_pid) : "/self") + "/net/";
  std::string text;
  if (!slurp(base + "dev", &text)) {
    ++*failed;
    return;
  }
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string iface = line.substr(0, colon);
    iface.erase(0, iface.find_first_not_of(' '));
    double f[16] = {};
    if (std::sscanf(line.c_str() + colon + 1, "%lf %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf", &f[0], &f[1], &f[2],
                    &f[3], &f[4], &f[5], &f[6], &f[7], &f[8], &f[9], &f[10], &f[11]) < 12)
      continue;
    std::string p = "net." + iface + ".";
    rates_.add(out, p + "rx_bytes", f[0], ts);
    rates_.add(out, p + "rx_packets", f[1], ts);
    rates_.add(out, p + "rx_errors", f[2], ts);
    rates_.add(out, p + "rx_drops", f[3], ts);
    rates_.add(out, p + "tx_bytes", f[8], ts);
    rates_.add(out, p + "tx_packets", f[9], ts);
    rates_.add(out, p + "tx_errors", f[10], ts);
    rates_.add(out, p + "tx_drops", f[11], ts);
  }
  if (!slurp(base + "snmp", &text)) return;
  // "Tcp: names..." then "Tcp: values...".
  std::istringstream snmp(text);
  std::string names, values;
  while (std::getline(snmp, names)) {
    if (names.rfind("Tcp:", 0) != 0 || !std::getline(snmp, values)) continue;
    std::istringstream n(names.substr(4)), v(values.substr(4));
    std::string key, val;
    while (n >> key && v >> val) {
      if (key == "RetransSegs") rates_.add(out, "net.tcp.retrans", std::strtod(val.c_str(), nullptr), ts);
      if (key == "OutSegs") rates_.add(out, "net.tcp.out_segs", std::strtod(val.c_str(), nullptr), ts);
    }
    break;
  }
}

std::vector<int> NodeSampler::job_pids() {
  std::set<int> pids(options_.pids.begin(), options_.pids.end());
  for (const auto& dir : options_.cgroups) {
    std::string text;
    if (!slurp(dir + "/cgroup.procs", &text)) continue;
    std::istringstream in(text);
    int pid;
    while (in >> pid) pids.insert(pid);
  }
  if (!options_.process_name.empty()) {
    DIR* d = opendir(options_.proc_root.c_str());
    if (d) {
      while (dirent* e = readdir(d)) {
        if (!is_number(e->d_name)) continue;
        std::string comm;
        if (!slurp(options_.proc_root + "/" + e->d_name + "/comm", &comm)) continue;
        while (!comm.empty() && comm.back() == '\n') comm.pop_back();
        if (comm == options_.process_name) pids.insert(std::atoi(e->d_name));
      }
      closedir(d);
    }
  }
  return {pids.begin(), pids.end()};
}

void NodeSampler::processes(int64_t ts, std::vector<Sample>* out, int* failed) {
  // Per-process counters are turned into rates per process (keyed by pid and
  // start time) and summed, so a process that exits or starts does not look
  // like the job's counter going backwards.
  double cpu = 0, rss = 0, rd = 0, wr = 0, vol = 0, invol = 0;
  int count = 0;
  for (int pid : job_pids()) {
    std::string dir = options_.proc_root + "/" + std::to_string(pid);
    std::string stat;
    if (!slurp(dir + "/stat", &stat)) continue;  // exited between listing and reading
    util::ProcStat ps;
    if (!util::parse_proc_stat(stat, &ps)) {
      ++*failed;
      continue;
    }
    std::string key = std::to_string(pid) + ":" + std::to_string(ps.start_time) + ":";
    double r;
    bool reset;
    ++count;
    rss += static_cast<double>(ps.rss_pages) * static_cast<double>(page_size_);
    if (rates_.rate(key + "cpu", static_cast<double>(ps.utime + ps.stime), ts, &r, &reset))
      cpu += r / static_cast<double>(ticks_per_s_);
    std::string text;
    if (slurp(dir + "/status", &text)) {
      auto kv = key_values(text);
      if (rates_.rate(key + "vol", kv["voluntary_ctxt_switches"], ts, &r, &reset)) vol += r;
      if (rates_.rate(key + "invol", kv["nonvoluntary_ctxt_switches"], ts, &r, &reset)) invol += r;
    }
    if (slurp(dir + "/io", &text)) {
      auto kv = key_values(text);
      if (rates_.rate(key + "rd", kv["read_bytes"], ts, &r, &reset)) rd += r;
      if (rates_.rate(key + "wr", kv["write_bytes"], ts, &r, &reset)) wr += r;
    }
  }
  add_gauge(out, "proc.count", count);
  if (count == 0) return;
  add_gauge(out, "proc.rss_bytes", rss);
  if (!have_proc_rates_) {  // the first round has no interval yet
    have_proc_rates_ = true;
    return;
  }
  add_gauge(out, "proc.cpu", cpu);
  add_gauge(out, "proc.ctxt_voluntary", vol);
  add_gauge(out, "proc.ctxt_involuntary", invol);
  add_gauge(out, "proc.read_bytes", rd);
  add_gauge(out, "proc.write_bytes", wr);
}

void NodeSampler::cgroup(const std::string& dir, int64_t ts, std::vector<Sample>* out) {
  std::string text;
  // One cgroup may be given through several hierarchies (v2 and v1 cpu):
  // a metric already produced this round is not produced twice.
  auto have = [&](const char* metric) {
    for (const Sample& s : *out)
      if (s.metric == metric) return true;
    return false;
  };
  auto rate = [&](const char* metric, double value, double scale) {
    if (!have(metric)) rates_.add(out, metric, value, ts, scale, dir + ":" + metric);
  };
  if (slurp(dir + "/cpu.stat", &text)) {
    auto kv = key_values(text);
    if (kv.count("usage_usec")) {
      rate("cgroup.cpu.usage", kv["usage_usec"], 1e-6);
      rate("cgroup.cpu.user", kv["user_usec"], 1e-6);
      rate("cgroup.cpu.system", kv["system_usec"], 1e-6);
    }
    if (kv.count("throttled_usec"))
      rate("cgroup.cpu.throttled", kv["throttled_usec"], 1e-6);
    else if (kv.count("throttled_time"))
      rate("cgroup.cpu.throttled", kv["throttled_time"], 1e-9);  // v1: ns
    if (kv.count("nr_throttled")) rate("cgroup.cpu.nr_throttled", kv["nr_throttled"], 1.0);
  }
  if (slurp(dir + "/cpuacct.usage", &text)) rate("cgroup.cpu.usage", std::strtod(text.c_str(), nullptr), 1e-9);
  if ((slurp(dir + "/memory.current", &text) || slurp(dir + "/memory.usage_in_bytes", &text)) &&
      !have("cgroup.memory.current"))
    add_gauge(out, "cgroup.memory.current", std::strtod(text.c_str(), nullptr));
  if (slurp(dir + "/io.stat", &text)) {
    double sum[4] = {};
    const char* keys[4] = {"rbytes=", "wbytes=", "rios=", "wios="};
    std::istringstream in(text);
    std::string tok;
    while (in >> tok)
      for (int k = 0; k < 4; ++k)
        if (tok.rfind(keys[k], 0) == 0) sum[k] += std::strtod(tok.c_str() + std::strlen(keys[k]), nullptr);
    rate("cgroup.io.read_bytes", sum[0], 1.0);
    rate("cgroup.io.write_bytes", sum[1], 1.0);
    rate("cgroup.io.read_ops", sum[2], 1.0);
    rate("cgroup.io.write_ops", sum[3], 1.0);
  }
  // Pressure stall information: "some ... total=USEC", as a fraction of time.
  const char* psi[3][2] = {{"cpu.pressure", "cgroup.cpu.pressure"},
                           {"memory.pressure", "cgroup.memory.pressure"},
                           {"io.pressure", "cgroup.io.pressure"}};
  for (auto& p : psi) {
    if (!slurp(dir + "/" + p[0], &text)) continue;
    size_t at = text.find("total=");
    if (text.rfind("some", 0) == 0 && at != std::string::npos)
      rate(p[1], std::strtod(text.c_str() + at + 6, nullptr), 1e-6);
  }
}

}  // namespace ballast::collect
