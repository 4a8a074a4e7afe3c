// Reads a node's metrics from /proc and /sys, and those of a job's processes
// and cgroups. Counters become per-second rates (samples.hpp), so the first
// call gives gauges only.
//
// Metric names (rates are per second):
//   cpu.user cpu.system cpu.iowait cpu.steal cpu.idle   percent of all CPUs
//   ctxt (context switches/s), procs.running, procs.blocked
//   mem.total_bytes mem.available_bytes mem.used_bytes  load.1 load.5 load.15
//   disk.DEV.read_bytes write_bytes read_ops write_ops busy (fraction of time)
//   net.IF.rx_bytes tx_bytes rx_packets tx_packets rx_errors tx_errors
//     rx_drops tx_drops; net.tcp.retrans net.tcp.out_segs (segments/s)
//   proc.cpu (cores) proc.rss_bytes proc.read_bytes proc.write_bytes
//     proc.ctxt_voluntary proc.ctxt_involuntary proc.count   (the job's processes, summed)
//   cgroup.cpu.usage cgroup.cpu.user cgroup.cpu.system (cores)
//     cgroup.cpu.throttled (fraction of time) cgroup.cpu.nr_throttled
//     cgroup.memory.current cgroup.io.read_bytes write_bytes read_ops write_ops
//     cgroup.cpu.pressure cgroup.memory.pressure cgroup.io.pressure (PSI "some", fraction)
#pragma once

#include "samples.hpp"

#include <string>
#include <vector>

namespace ballast::collect {

struct NodeOptions {
  bool system = true;                // node-wide cpu, memory, load, disk, network
  std::vector<int> pids;             // the job's processes, given
  std::string process_name;          // ... or matched by /proc/PID/comm (exact)
  std::vector<std::string> cgroups;  // cgroup directories (v2, or v1 cpu/memory); their
                                     // cgroup.procs are the job's processes too
  int net_pid = 0;                   // read network from /proc/PID/net (its netns); 0 = own
  std::string proc_root = "/proc";   // for tests
};

class NodeSampler {
 public:
  explicit NodeSampler(NodeOptions options);
  // Append this round's samples. Unreadable sources are skipped silently
  // (a process that exits, a cgroup removed); returns how many sources failed.
  int sample(int64_t ts_ns, std::vector<Sample>* out);
  const NodeOptions& options() const { return options_; }

 private:
  void system_cpu(int64_t ts, std::vector<Sample>* out, int* failed);
  void memory_load(std::vector<Sample>* out, int* failed);
  void disks(int64_t ts, std::vector<Sample>* out, int* failed);
  void network(int64_t ts, std::vector<Sample>* out, int* failed);
  void processes(int64_t ts, std::vector<Sample>* out, int* failed);
  void cgroup(const std::string& dir, int64_t ts, std::vector<Sample>* out);
  std::vector<int> job_pids();

  NodeOptions options_;
  Rates rates_;
  double prev_cpu_[6] = {};  // user, system, iowait, steal, idle, total jiffies
  bool have_cpu_ = false;
  bool have_proc_rates_ = false;
  long ticks_per_s_;
  long page_size_;
};

}  // namespace ballast::collect
