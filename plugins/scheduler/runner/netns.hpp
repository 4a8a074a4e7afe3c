// A network of its own for each slot of the local backend (job.netns): every
// slot gets a network namespace whose one interface, eth0, is a veth pair to
// a bridge, and the bridge sits in a namespace of its own (the job's
// "switch"). Nothing is added to the machine's own network: the slots reach
// each other and nothing else, so their addresses (10.99.0.0/16) cannot
// collide with the machine's, and removing the job's namespaces removes
// every link and the bridge with them.
//
// Names: ballast-<pid>-<start>-<n>-s<slot> and ...-sw, where pid and start
// (its start time in clock ticks, /proc/PID/stat) identify the process that
// made them. Namespaces of a process that is gone (a run killed by SIGKILL)
// are removed by the next one's create(). Every call from one thread.
#pragma once

#include <string>
#include <vector>

namespace ballast::runner {

// job.netns: false, true (an error when namespaces cannot be made), "auto"
// (namespaces when they can be made, else the machine's shared network).
enum class NetnsMode { off, on, automatic };

class SlotNetworks {
 public:
  SlotNetworks() = default;
  ~SlotNetworks();
  SlotNetworks(const SlotNetworks&) = delete;
  SlotNetworks& operator=(const SlotNetworks&) = delete;

  // Whether this process may make network namespaces (root, and `ip` and
  // `tc` found); *why says what is missing when not.
  static bool available(std::string* why);
  // Remove the namespaces of runs whose process is gone; their names in
  // *removed.
  static void remove_stale(std::vector<std::string>* removed);

  // Make `slots` namespaces and the switch. False with *error; then nothing
  // is left behind.
  bool create(int slots, std::string* error);
  // Remove them all (their ranks stopped first: a namespace a process still
  // runs in lives on, unnamed, until it ends).
  void destroy();
  bool active() const { return !fds_.empty(); }

  // An open descriptor of the slot's namespace, for setns(2) in a child.
  int fd(int slot) const { return fds_[size_t(slot)]; }
  std::string name(int slot) const;
  // The slot's IPv4 address on the job's network.
  static std::string address(int slot);
  // The slot's interface, the same name in every slot.
  static const char* interface() { return "eth0"; }
  // What the job's network is, in words.
  std::string describe() const;

  // A degraded link (machine kind=net): the slot's link limited to
  // kDegradedMbit each way with tc tbf. Out of the slot a small queue that
  // drops (its TCP retransmits, as a bad NIC makes it), towards it a deep
  // one (its peers only wait). False with *error.
  bool degrade(int slot, std::string* error);
  // The link at full speed again (no-op when it was not degraded).
  void repair(int slot);
  static constexpr int kDegradedMbit = 20;

 private:
  std::string prefix_;  // ballast-<pid>-<start>-<n>
  std::vector<int> fds_;
  std::vector<bool> degraded_;
};

}  // namespace ballast::runner
