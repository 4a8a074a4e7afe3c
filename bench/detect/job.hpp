// An emulated training job on this machine: N "machines", each a group of
// real worker processes (own cgroup, own network namespace where the kernel
// allows) that compute a fixed amount of work per step and then meet at a
// barrier run by a coordinator over TCP, sending a payload each step like a
// gradient exchange. Faults are injected into one machine for real.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace bench_detect {

struct JobOptions {
  int machines = 5;
  int workers = 2;       // processes per machine
  double work_ms = 6;    // CPU work per worker per step (calibrated, fixed work)
  double pace_ms = 100;  // the coordinator releases a step no sooner than this
  int payload_bytes = 128 * 1024;
  std::string self_exe;  // this program, re-executed as worker or hog
};

// What this machine allows, probed once.
struct Capabilities {
  bool cgroup_v2 = false;  // /sys/fs/cgroup/unified (or /sys/fs/cgroup) writable
  bool cgroup_v1_cpu = false;
  bool netns = false;  // ip netns + veth
  bool tbf = false;    // tc tbf on a veth
  bool netem = false;
  std::string v2_root, v1_cpu_root;
  std::string notes;  // why something is missing
};

Capabilities probe();

enum class Fault { none, cpu_hog, cpu_throttle, sigstop, memory, disk_io, net_throttle };
const char* fault_name(Fault f);
std::vector<Fault> available_faults(const Capabilities& caps, std::string* missing);

struct Machine {
  std::string name;                  // "m0"
  std::vector<std::string> cgroups;  // v2 dir, v1 cpu dir
  std::string netns;                 // "" when none
  std::string veth_host, veth_ns;    // interface names
  std::string host_ip;               // the coordinator's address as seen from the machine
  std::vector<pid_t> workers;
  std::vector<pid_t> hogs;
};

class Job {
 public:
  Job(JobOptions options, Capabilities caps);
  ~Job();  // stops everything and removes cgroups, namespaces, files

  // Create cgroups and namespaces (once). False with *error.
  bool setup(std::string* error);
  // Start the coordinator and every worker; returns when all are connected.
  bool start(std::string* error);
  // Stop workers and hogs, undo faults (the infrastructure stays).
  void stop();
  bool inject(Fault f, int machine, std::string* error);

  std::vector<Machine>& machines() { return machines_; }
  uint64_t steps() const { return steps_.load(); }

 private:
  pid_t spawn(const std::vector<std::string>& args);
  void coordinator(int listen_fd);

  JobOptions opt_;
  Capabilities caps_;
  std::string tag_;
  std::vector<Machine> machines_;
  std::thread coord_;
  std::atomic<bool> running_{false};
  std::atomic<uint64_t> steps_{0};
  int listen_fd_ = -1, port_ = 0;
  std::string disk_file_;
  bool setup_done_ = false;
};

// Entry points of the re-executed program.
int worker_main(int argc, char** argv);
int hog_main(int argc, char** argv);
// Iterations of the worker's inner loop per millisecond, measured here.
double calibrate_work();

}  // namespace bench_detect
