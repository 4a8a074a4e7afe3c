// The local backend: every slot runs on this machine. A slot gets a cgroup
// v2 folder of its own when /sys/fs/cgroup (or its unified mount) lets us
// make one, so that its processes are counted and killed together;
// otherwise its ranks are plain process groups. Each rank leads its own
// process group and dies with the executor (PR_SET_PDEATHSIG). With
// job.netns, a slot also gets a network namespace of its own (netns.hpp),
// which its ranks and helpers join before they run.
#pragma once

#include "backend.hpp"
#include "netns.hpp"

#include <map>
#include <set>

namespace ballast::runner {

class LocalBackend : public Backend {
 public:
  // use_cgroups: try cgroup v2 (false: process groups only); netns: a
  // network namespace per slot.
  LocalBackend(bool use_cgroups, NetnsMode netns = NetnsMode::off);
  ~LocalBackend() override;

  const char* name() const override { return "local"; }
  bool prepare(int slots, const std::string& job_dir, std::string* error) override;
  std::string isolation() const override;
  bool start(int slot, const std::vector<RankLaunch>& ranks, std::string* error) override;
  bool signal(int rank, int sig) override;
  void stop_all(double grace_s) override;
  std::vector<RankExit> reap() override;
  bool running(int rank) const override;
  pid_t pid(int rank) const override;
  std::vector<pid_t> slot_processes(int slot) const override;
  pid_t spawn_helper(int slot, void (*fn)()) override;
  void stop_helpers(int slot) override;
  bool network_per_slot() const override { return networks_.active(); }
  bool degrade_network(int slot, std::string* error) override;
  std::vector<std::pair<std::string, std::string>> slot_env(int slot, int master_slot) const override;
  void release() override;

 private:
  struct Proc {
    pid_t pid = -1;
    int slot = -1;
  };
  pid_t fork_into(int slot);  // fork; the child joins the slot's cgroup, network and its own group
  void make_cgroups(int slots);
  void remove_cgroups();

  bool use_cgroups_;
  NetnsMode netns_;
  SlotNetworks networks_;
  std::string netns_note_;   // why there are none (auto), stale namespaces removed
  std::string cgroup_root_;  // ".../ballast-PID-N" when cgroups are used
  std::vector<std::string> slot_cgroups_;
  std::map<int, Proc> ranks_;          // running ranks by rank
  std::multimap<int, pid_t> helpers_;  // by slot
};

}  // namespace ballast::runner
