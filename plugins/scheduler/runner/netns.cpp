#include "netns.hpp"

#include "subprocess.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ballast::runner {

namespace {

constexpr const char* kNetnsDir = "/run/netns";  // where `ip netns` names namespaces
constexpr int kCommandTimeoutMs = 10000;

std::atomic<int> g_networks{0};

// A program of iproute2 in PATH or the usual sbin folders, "" if none.
std::string find_tool(const std::string& name) {
  std::string dirs = std::getenv("PATH") ? std::getenv("PATH") : "";
  dirs += ":/usr/sbin:/sbin:/usr/bin:/bin";
  std::stringstream ss(dirs);
  for (std::string d; std::getline(ss, d, ':');)
    if (!d.empty() && access((d + "/" + name).c_str(), X_OK) == 0) return d + "/" + name;
  return "";
}

// Run an iproute2 command; false with *error naming it and what it said.
bool run(const std::vector<std::string>& argv, std::string* error) {
  slurm::CommandResult r;
  std::string why;
  std::vector<std::string> cmd = argv;
  cmd[0] = find_tool(argv[0]);
  if (cmd[0].empty()) {
    if (error) *error = argv[0] + " (iproute2) is not installed";
    return false;
  }
  if (slurm::run_command(cmd, {}, kCommandTimeoutMs, &r, &why) && r.exit_code == 0) return true;
  if (error) {
    std::string text;
    for (const auto& a : argv) text += (text.empty() ? "" : " ") + a;
    std::string said = why.empty() ? r.err : why;
    while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
    *error = "'" + text + "' failed" + (said.empty() ? " (exit " + std::to_string(r.exit_code) + ")" : ": " + said);
  }
  return false;
}

// A process's start time in clock ticks after boot (field 22 of
// /proc/PID/stat), 0 when it does not exist.
unsigned long long start_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return 0;
  const auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  return 0;
}

}  // namespace

SlotNetworks::~SlotNetworks() { destroy(); }

bool SlotNetworks::available(std::string* why) {
  if (geteuid() != 0) {
    *why = "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)";
    return false;
  }
  for (const char* tool : {"ip", "tc"})
    if (find_tool(tool).empty()) {
      *why = std::string(tool) + " (iproute2) is not installed";
      return false;
    }
  return true;
}

void SlotNetworks::remove_stale(std::vector<std::string>* removed) {
  DIR* d = opendir(kNetnsDir);
  if (!d) return;
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    int pid = 0, n = 0, used = 0;
    unsigned long long start = 0;
    if (std::sscanf(e->d_name, "ballast-%d-%llu-%d-%n", &pid, &start, &n, &used) != 3 || used == 0) continue;
    if (pid > 0 && start_time(pid) == start) continue;  // its process still runs
    stale.push_back(e->d_name);
  }
  closedir(d);
  for (const auto& name : stale)
    if (run({"ip", "netns", "del", name}, nullptr)) removed->push_back(name);
}

std::string SlotNetworks::name(int slot) const { return prefix_ + "-s" + std::to_string(slot); }

std::string SlotNetworks::address(int slot) {
  const int host = slot + 1;  // 10.99.0.1 is slot 0
  return "10.99." + std::to_string(host >> 8) + "." + std::to_string(host & 255);
}

std::string SlotNetworks::describe() const {
  return "a network namespace per slot (" + prefix_ + "-s*, " + interface() + " " + address(0) +
         "/16 ... on a bridge in " + prefix_ + "-sw)";
}

bool SlotNetworks::create(int slots, std::string* error) {
  destroy();
  if (slots <= 0 || slots > 60000) {
    *error = "network namespaces: " + std::to_string(slots) + " slots (1-60000)";
    return false;
  }
  prefix_ = "ballast-" + std::to_string(getpid()) + "-" + std::to_string(start_time(getpid())) + "-" +
            std::to_string(g_networks++);
  const std::string sw = prefix_ + "-sw";
  std::vector<std::vector<std::string>> cmds = {{"ip", "netns", "add", sw},
                                                {"ip", "-n", sw, "link", "add", "br0", "type", "bridge"},
                                                {"ip", "-n", sw, "link", "set", "br0", "up"}};
  for (int s = 0; s < slots; ++s) {
    const std::string ns = name(s), port = "s" + std::to_string(s);
    cmds.push_back({"ip", "netns", "add", ns});
    cmds.push_back({"ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", interface(), "netns", ns});
    cmds.push_back({"ip", "-n", sw, "link", "set", port, "master", "br0", "up"});
    cmds.push_back({"ip", "-n", ns, "addr", "add", address(s) + "/16", "dev", interface()});
    cmds.push_back({"ip", "-n", ns, "link", "set", interface(), "up"});
    cmds.push_back({"ip", "-n", ns, "link", "set", "lo", "up"});
  }
  std::vector<std::string> made;
  bool ok = true;
  for (const auto& c : cmds) {
    if (!(ok = run(c, error))) break;
    if (c[1] == "netns") made.push_back(c[3]);
  }
  for (int s = 0; ok && s < slots; ++s) {
    const std::string path = std::string(kNetnsDir) + "/" + name(s);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      *error = "cannot open " + path + ": " + std::strerror(errno);
      ok = false;
      break;
    }
    fds_.push_back(fd);
  }
  if (!ok) {
    for (int fd : fds_) close(fd);
    fds_.clear();
    for (const auto& ns : made) run({"ip", "netns", "del", ns}, nullptr);
    prefix_.clear();
    return false;
  }
  degraded_.assign(size_t(slots), false);
  return true;
}

void SlotNetworks::destroy() {
  if (prefix_.empty()) return;
  for (int fd : fds_) close(fd);
  const int slots = int(fds_.size());
  fds_.clear();
  // A slot's namespace takes its veth pair with it; the switch's, the bridge.
  for (int s = 0; s < slots; ++s) run({"ip", "netns", "del", name(s)}, nullptr);
  run({"ip", "netns", "del", prefix_ + "-sw"}, nullptr);
  degraded_.clear();
  prefix_.clear();
}

bool SlotNetworks::degrade(int slot, std::string* error) {
  if (slot < 0 || slot >= int(fds_.size())) {
    *error = "slot " + std::to_string(slot) + " has no network namespace";
    return false;
  }
  const std::string rate = std::to_string(kDegradedMbit) + "mbit";
  if (!run({"tc", "-n", name(slot), "qdisc", "replace", "dev", interface(), "root", "tbf", "rate", rate, "burst",
            "32kb", "limit", "64kb"},
           error) ||
      !run({"tc", "-n", prefix_ + "-sw", "qdisc", "replace", "dev", "s" + std::to_string(slot), "root", "tbf", "rate",
            rate, "burst", "32kb", "limit", "4mb"},
           error)) {
    degraded_[size_t(slot)] = true;  // whichever half took is undone
    repair(slot);
    return false;
  }
  degraded_[size_t(slot)] = true;
  return true;
}

void SlotNetworks::repair(int slot) {
  if (slot < 0 || slot >= int(degraded_.size()) || !degraded_[size_t(slot)]) return;
  run({"tc", "-n", name(slot), "qdisc", "del", "dev", interface(), "root"}, nullptr);
  run({"tc", "-n", prefix_ + "-sw", "qdisc", "del", "dev", "s" + std::to_string(slot), "root"}, nullptr);
  degraded_[size_t(slot)] = false;
}

}  // namespace ballast::runner
