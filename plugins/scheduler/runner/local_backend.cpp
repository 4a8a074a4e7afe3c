#include "local_backend.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

extern char** environ;

namespace ballast::runner {

namespace {

bool write_text(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write(fd, text.data(), text.size()) == ssize_t(text.size());
  close(fd);
  return ok;
}

// The writable cgroup v2 hierarchy, "" if none.
std::string cgroup_v2_root() {
  for (const char* root : {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}) {
    const std::string r = root;
    if (access((r + "/cgroup.procs").c_str(), W_OK) != 0 || access((r + "/cgroup.controllers").c_str(), F_OK) != 0)
      continue;
    if (access(r.c_str(), W_OK) == 0) return r;
  }
  return "";
}

// Remove the cgroup folder of a run that is gone. Its ranks were sent
// SIGKILL with it (PR_SET_PDEATHSIG), but a large process takes a moment to
// exit and stays in the folder until then (rmdir: EBUSY); what is still
// there (a rank's own children) is killed, and the removal retried for up
// to 3 s.
void remove_dead_cgroup(const std::string& dir) {
  if (FILE* f = std::fopen((dir + "/cgroup.procs").c_str(), "r")) {
    for (int pid = 0; std::fscanf(f, "%d", &pid) == 1;)
      if (pid > 0) kill(pid, SIGKILL);
    std::fclose(f);
  }
  for (int i = 0; i < 150 && rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// The cgroups of runs whose process is gone (killed by SIGKILL).
void remove_stale_cgroups(const std::string& root) {
  DIR* d = opendir(root.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    int pid = 0, n = 0, used = 0;
    if (std::sscanf(e->d_name, "ballast-%d-%d%n", &pid, &n, &used) == 2 && e->d_name[used] == '\0' && pid > 0 &&
        kill(pid, 0) != 0 && errno == ESRCH)
      stale.push_back(root + "/" + e->d_name);
  }
  closedir(d);
  for (const auto& dir : stale) {
    if (DIR* sd = opendir(dir.c_str())) {
      while (dirent* e = readdir(sd))
        if (std::strncmp(e->d_name, "slot", 4) == 0) remove_dead_cgroup(dir + "/" + e->d_name);
      closedir(sd);
    }
    remove_dead_cgroup(dir);
  }
}

std::atomic<int> g_backends{0};

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

LocalBackend::LocalBackend(bool use_cgroups, NetnsMode netns) : use_cgroups_(use_cgroups), netns_(netns) {}

LocalBackend::~LocalBackend() {
  stop_all(1);
  release();
}

bool LocalBackend::prepare(int slots, const std::string& /*job_dir*/, std::string* error) {
  if (slots <= 0) {
    *error = "no slot to prepare";
    return false;
  }
  slot_cgroups_.assign(size_t(slots), "");
  if (use_cgroups_) make_cgroups(slots);
  if (netns_ == NetnsMode::off) return true;
  std::string why;
  std::vector<std::string> stale;
  if (SlotNetworks::available(&why)) {
    SlotNetworks::remove_stale(&stale);
    networks_.create(slots, &why);
  }
  if (!networks_.active() && netns_ == NetnsMode::on) {
    remove_cgroups();
    *error = "job.netns = true: cannot make a network namespace per slot: " + why;
    return false;
  }
  if (!networks_.active()) netns_note_ = "no network namespaces (job.netns = \"auto\"): " + why;
  if (!stale.empty()) {
    netns_note_ +=
        std::string(netns_note_.empty() ? "" : "; ") + "removed the network namespaces of runs that are gone:";
    for (const auto& n : stale) netns_note_ += " " + n;
  }
  return true;
}

void LocalBackend::make_cgroups(int slots) {
  const std::string root = cgroup_v2_root();
  if (root.empty()) return;  // process groups only
  remove_stale_cgroups(root);
  const std::string dir = root + "/ballast-" + std::to_string(getpid()) + "-" + std::to_string(g_backends++);
  if (mkdir(dir.c_str(), 0755) != 0) return;
  cgroup_root_ = dir;
  for (int s = 0; s < slots; ++s) {
    const std::string d = dir + "/slot" + std::to_string(s);
    if (mkdir(d.c_str(), 0755) != 0) {
      remove_cgroups();
      slot_cgroups_.assign(size_t(slots), "");
      return;
    }
    slot_cgroups_[size_t(s)] = d;
  }
}

std::string LocalBackend::isolation() const {
  std::string s =
      cgroup_root_.empty() ? "process groups (no writable cgroup v2)" : "a cgroup v2 per slot under " + cgroup_root_;
  if (networks_.active()) s += ", " + networks_.describe();
  if (!netns_note_.empty()) s += "; " + netns_note_;
  return s;
}

pid_t LocalBackend::fork_into(int slot) {
  const pid_t parent = getpid();
  const std::string& cg = slot_cgroups_[size_t(slot)];
  const std::string procs = cg.empty() ? std::string() : cg + "/cgroup.procs";
  const int netns_fd = networks_.active() ? networks_.fd(slot) : -1;
  const pid_t pid = fork();
  if (pid != 0) {
    if (pid > 0) setpgid(pid, pid);  // as the child does: a signal sent before it ran must reach its group
    return pid;
  }
  // Child: only async-signal-safe calls until exec (the parent has threads).
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  if (netns_fd >= 0 && setns(netns_fd, CLONE_NEWNET) != 0) {
    const char msg[] = "ballast executor: cannot join the slot's network namespace\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(126);
  }
  if (!procs.empty()) {
    char buf[32];
    const int n = std::snprintf(buf, sizeof buf, "%d", int(getpid()));
    const int fd = open(procs.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      ssize_t w = write(fd, buf, size_t(n));
      (void)w;
      close(fd);
    }
  }
  return 0;
}

bool LocalBackend::start(int slot, const std::vector<RankLaunch>& ranks, std::string* error) {
  if (slot < 0 || size_t(slot) >= slot_cgroups_.size()) {
    *error = "slot " + std::to_string(slot) + " does not exist";
    return false;
  }
  std::vector<int> started;
  for (const auto& r : ranks) {
    if (r.argv.empty()) {
      *error = "rank " + std::to_string(r.rank) + ": empty command";
      break;
    }
    // Everything the child needs is built before fork: it may not allocate.
    std::vector<std::string> env_store;
    for (char** e = environ; *e; ++e) {
      bool replaced = false;
      for (const auto& [k, v] : r.env)
        replaced = replaced || (std::strncmp(*e, k.c_str(), k.size()) == 0 && (*e)[k.size()] == '=');
      if (!replaced) env_store.emplace_back(*e);
    }
    for (const auto& [k, v] : r.env) env_store.push_back(k + "=" + v);
    std::vector<char*> envp, argv;
    for (auto& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_store = r.argv;
    for (auto& a : argv_store) argv.push_back(a.data());
    argv.push_back(nullptr);
    int log_fd = -1;
    if (!r.log_path.empty()) {
      log_fd = open(r.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (log_fd < 0) {
        *error = "cannot open " + r.log_path + ": " + std::strerror(errno);
        break;
      }
    }
    const pid_t pid = fork_into(slot);
    if (pid == 0) {
      if (log_fd >= 0) {
        dup2(log_fd, 1);
        dup2(log_fd, 2);
      }
      execvpe(argv[0], argv.data(), envp.data());
      const char* why = strerror(errno);
      ssize_t w = write(2, "ballast executor: exec failed: ", 31);
      w = write(2, why, std::strlen(why));
      w = write(2, "\n", 1);
      (void)w;
      _exit(127);
    }
    if (log_fd >= 0) close(log_fd);
    if (pid < 0) {
      *error = std::string("fork: ") + std::strerror(errno);
      break;
    }
    ranks_[r.rank] = {pid, slot};
    started.push_back(r.rank);
  }
  if (started.size() == ranks.size()) return true;
  for (int r : started) {
    const pid_t p = ranks_[r].pid;
    kill(-p, SIGKILL);
    waitpid(p, nullptr, 0);
    ranks_.erase(r);
  }
  return false;
}

bool LocalBackend::signal(int rank, int sig) {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return false;
  return kill(-it->second.pid, sig) == 0;
}

void LocalBackend::stop_all(double grace_s) {
  for (auto& [r, p] : ranks_) {
    kill(-p.pid, SIGTERM);
    kill(-p.pid, SIGCONT);  // a stopped process must run to die of it
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto alive = [](pid_t p) { return kill(-p, 0) == 0; };
  std::map<int, bool> reaped;
  for (bool any = true; any && since(t0) < grace_s;) {
    any = false;
    for (auto& [r, p] : ranks_) {
      if (!reaped[r] && waitpid(p.pid, nullptr, WNOHANG) == p.pid) reaped[r] = true;
      any = any || !reaped[r] || alive(p.pid);
    }
    if (any) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (auto& [r, p] : ranks_) {
    if (!reaped[r] || alive(p.pid)) kill(-p.pid, SIGKILL);
    if (!reaped[r]) waitpid(p.pid, nullptr, 0);
  }
  ranks_.clear();
  // Whatever a rank left behind in its slot (a child in a group of its own).
  for (const auto& cg : slot_cgroups_)
    if (!cg.empty()) write_text(cg + "/cgroup.kill", "1");
}

std::vector<RankExit> LocalBackend::reap() {
  std::vector<RankExit> out;
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    int st = 0;
    if (waitpid(it->second.pid, &st, WNOHANG) == it->second.pid) {
      out.push_back({it->first, it->second.pid, st});
      kill(-it->second.pid, SIGKILL);  // the rank's own children go with it
      it = ranks_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

bool LocalBackend::running(int rank) const { return ranks_.count(rank) != 0; }

pid_t LocalBackend::pid(int rank) const {
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? -1 : it->second.pid;
}

std::vector<pid_t> LocalBackend::slot_processes(int slot) const {
  std::vector<pid_t> out;
  if (slot >= 0 && size_t(slot) < slot_cgroups_.size() && !slot_cgroups_[size_t(slot)].empty()) {
    std::ifstream in(slot_cgroups_[size_t(slot)] + "/cgroup.procs");
    for (pid_t p; in >> p;) out.push_back(p);
    return out;
  }
  for (const auto& [r, p] : ranks_)
    if (p.slot == slot) out.push_back(p.pid);
  auto range = helpers_.equal_range(slot);
  for (auto it = range.first; it != range.second; ++it) out.push_back(it->second);
  return out;
}

pid_t LocalBackend::spawn_helper(int slot, void (*fn)()) {
  if (slot < 0 || size_t(slot) >= slot_cgroups_.size()) return -1;
  const pid_t pid = fork_into(slot);
  if (pid == 0) {
    fn();
    _exit(0);
  }
  if (pid > 0) helpers_.emplace(slot, pid);
  return pid;
}

bool LocalBackend::degrade_network(int slot, std::string* error) {
  if (!networks_.active()) return Backend::degrade_network(slot, error);
  return networks_.degrade(slot, error);
}

std::vector<std::pair<std::string, std::string>> LocalBackend::slot_env(int /*slot*/, int master_slot) const {
  if (!networks_.active()) return {};
  // Rank 0 listens on its slot's address; every transport goes through the
  // slot's link: UCX over tcp (its shared-memory transports would reach a
  // peer in another namespace of this machine directly), on eth0.
  const std::string dev = SlotNetworks::interface();
  return {{"MASTER_ADDR", SlotNetworks::address(master_slot)},
          {"UCX_TLS", "tcp"},
          {"UCX_NET_DEVICES", dev},
          {"NCCL_SOCKET_IFNAME", dev},
          {"GLOO_SOCKET_IFNAME", dev}};
}

void LocalBackend::stop_helpers(int slot) {
  networks_.repair(slot);
  auto range = helpers_.equal_range(slot);
  for (auto it = range.first; it != range.second; ++it) {
    kill(-it->second, SIGKILL);
    waitpid(it->second, nullptr, 0);
  }
  helpers_.erase(slot);
}

void LocalBackend::release() {
  for (int s = 0; s < int(slot_cgroups_.size()); ++s) stop_helpers(s);
  remove_cgroups();
  networks_.destroy();
}

void LocalBackend::remove_cgroups() {
  for (auto& cg : slot_cgroups_) {
    if (cg.empty()) continue;
    write_text(cg + "/cgroup.kill", "1");
    for (int i = 0; i < 100 && rmdir(cg.c_str()) != 0 && errno == EBUSY; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    cg.clear();
  }
  if (!cgroup_root_.empty()) rmdir(cgroup_root_.c_str());
  cgroup_root_.clear();
}

}  // namespace ballast::runner
