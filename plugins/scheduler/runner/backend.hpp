// The seam between the executor and the machines it runs ranks on. The
// executor decides (which ranks, on which slot, when); a backend carries it
// out. A slot is what a node is to a real cluster: the unit that is evicted
// and replaced. The local backend runs every slot on this machine; the Slurm
// backend (slurm_backend.hpp) runs the job as one requeueable batch job.
#pragma once

#include <ballast/status.h>

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ballast::runner {

// One rank to start: its global number, the command and the environment it
// gets on top of the executor's own, and where its stdout/stderr go.
struct RankLaunch {
  int rank = 0;
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::string log_path;  // appended to; "" = inherit the executor's
};

// A rank that ended, as waitpid reports it.
struct RankExit {
  int rank = -1;
  pid_t pid = -1;
  int status = 0;  // wait status: WIFEXITED / WIFSIGNALED
};

// What a controller that begins to lead makes of the records its
// predecessors left (plugin.h's fence_action, in etcd's action log, handed
// over in the controller.leader event): the job they ran, when it adopts it.
struct TakeOver {
  enum Outcome {
    none,     // nothing of this job's in the log: a fresh start
    adopted,  // the job runs (or waits) in Slurm: this executor carries it on
    ended,    // the job an earlier leader started is gone: not started again
  } outcome = none;
  std::vector<std::string> slots;  // adopted: every slot's name
  std::vector<int> active;         // adopted: job node -> slot, as the last attempt had them
  // adopted: slots an earlier leader drained and none resumed; true when the
  // drain was for node.silent (resumed once the node's agent connects).
  std::map<int, bool> drained;
  // adopted: the attempt that still runs as the last launch record left it
  // (what set_attempt gave that leader's backend), when Slurm confirms it
  // running on the recorded nodes and no action was in flight at that leader:
  // the executor re-attaches to its ranks. Null: the job was requeued, and
  // `restart` says why.
  nlohmann::json attempt;
  std::string restart;
  std::string detail;  // in words, for the log
  // adopted: the report's figures of the newest snapshot (handover.hpp's
  // form, read and checked by the executor); null when it has none.
  nlohmann::json report;
};

// Asked before a command with effects outside this process (plugin.h's
// fence_action): kind ("slurm.drain", ...) and what it is about. BALLAST_OK
// to act; otherwise the command is not run and *why says why.
using Fence = std::function<int(const std::string& kind, const nlohmann::json& record, std::string* why)>;

// Every call comes from the executor's one supervising thread.
class Backend {
 public:
  virtual ~Backend() = default;
  // The fence a backend whose commands reach outside this process asks
  // first (the Slurm backend); the local backend's ranks are this process's
  // children and it asks nothing.
  void set_fence(Fence fence) { fence_ = std::move(fence); }
  // Whether the last command refused by the fence was refused because this
  // controller does not lead (BALLAST_EFENCED), and no command was allowed
  // since.
  bool fenced_off() const { return fenced_off_; }
  // "local", "slurm", ...
  virtual const char* name() const = 0;
  // Make `slots` slots ready (the job's and the standbys); job_dir is the
  // job's folder (shared with the ranks). False with *error.
  virtual bool prepare(int slots, const std::string& job_dir, std::string* error) = 0;
  // A slot's name, as node.silent and the placement plugin name it.
  virtual std::string slot_name(int slot) const { return "node" + std::to_string(slot); }
  // What isolates a slot here, in words ("cgroup v2 per slot", "process groups").
  virtual std::string isolation() const = 0;
  // Start `ranks` on slot `slot`. On failure none of them runs (those
  // already started are killed) and *error says why.
  virtual bool start(int slot, const std::vector<RankLaunch>& ranks, std::string* error) = 0;
  // Every slot of an attempt got its start(): a backend that starts an
  // attempt as a whole (Slurm: the job released onto exactly those nodes)
  // does it here. False with *error; then none of the ranks runs.
  virtual bool launch(std::string* error) {
    (void)error;
    return true;
  }
  // The executor takes an active slot out of the job for `reason` (evict),
  // before its ranks are stopped. False with *error: the slot stays in.
  // `cause` is the topic of the event behind it ("node.silent", ...).
  virtual bool evict(int slot, const std::string& reason, const std::string& cause, std::string* error) {
    (void)slot, (void)reason, (void)cause, (void)error;
    return true;
  }
  // Whether its commands reach outside this process and ask the fence
  // first (the Slurm backend): then a controller candidate's executor may
  // wait to lead, and may take over a job an earlier leader ran.
  virtual bool acts_outside() const { return false; }
  // Called once per new term before this executor's first start, with the
  // records of the earlier leaders (the controller.leader event's `log`,
  // oldest first). False with *error when the job cannot be taken over;
  // BALLAST_EFENCED refusals leave fenced_off() true.
  virtual bool take_over(const nlohmann::json& log, TakeOver* out, std::string* error) {
    (void)log, (void)error;
    *out = TakeOver{};
    return true;
  }
  // What the executor knows of the attempt it launches next (its number,
  // start, MASTER_PORT, checkpoint), kept in the records a successor reads
  // (TakeOver::attempt). Called before launch().
  void set_attempt(nlohmann::json attempt) { attempt_ = std::move(attempt); }
  // What the executor's report carries on to a successor (handover.hpp),
  // asked for at each record of the backend's whole state.
  void set_report(std::function<nlohmann::json()> report) { report_ = std::move(report); }
  // Called while the job trains undisturbed: a backend whose state a
  // successor takes over records it when its last record is too old.
  virtual void refresh() {}
  // After take_over found TakeOver::attempt: carry on the running ranks
  // (rank -> slot) of the adopted attempt instead of starting new ones.
  // False with *error; then the executor restarts the job.
  virtual bool reattach(const std::map<int, int>& rank_slots, std::string* error) {
    (void)rank_slots;
    *error = std::string("the ") + name() + " backend cannot re-attach to running ranks";
    return false;
  }
  // Whether an evicted slot is repaired when its node is heard again
  // (node.back from the cluster controller) rather than repair_seconds after
  // its eviction: true where slots are machines with agents (Slurm).
  virtual bool repaired_when_back() const { return false; }
  // An evicted slot is repaired: it is a standby again. False with *error.
  virtual bool restore(int slot, std::string* error) {
    (void)slot, (void)error;
    return true;
  }
  // Send `sig` to a rank's process group (its children too). False when the
  // rank does not run.
  virtual bool signal(int rank, int sig) = 0;
  // Stop every running rank: SIGTERM (and SIGCONT) to each group, up to
  // grace_s for them to end, then SIGKILL; every rank reaped. Blocks.
  // Exits reaped here are not reported by reap().
  virtual void stop_all(double grace_s) = 0;
  // Ranks that ended since the last call, without blocking.
  virtual std::vector<RankExit> reap() = 0;
  // Whether rank runs (started, not reaped).
  virtual bool running(int rank) const = 0;
  virtual pid_t pid(int rank) const = 0;
  // Processes that belong to a slot now (ranks, their children, helpers),
  // for the slot's metrics.
  virtual std::vector<pid_t> slot_processes(int slot) const = 0;
  // Start a helper process in a slot that runs fn() and never returns from
  // it (fault injection: a CPU or memory hog on that "node"). Killed by
  // stop_helpers. -1 on failure.
  virtual pid_t spawn_helper(int slot, void (*fn)()) = 0;
  // Undo the slot's fault injections: its helpers killed, its network (when
  // degraded) whole again.
  virtual void stop_helpers(int slot) = 0;
  // Whether each slot has a network of its own (machine kind=net can be
  // injected, and the slot's network counters read through its processes).
  virtual bool network_per_slot() const { return false; }
  // Degrade a slot's network (fault injection); undone by stop_helpers.
  virtual bool degrade_network(int slot, std::string* error) {
    (void)slot;
    *error = std::string("the ") + name() + " backend gives no slot a network of its own";
    return false;
  }
  // Environment a rank of `slot` gets on top of the job's, when rank 0 runs
  // on `master_slot`: MASTER_ADDR and the transports' interfaces of a slot
  // with a network of its own. Empty: torchrun's loopback.
  virtual std::vector<std::pair<std::string, std::string>> slot_env(int slot, int master_slot) const {
    (void)slot, (void)master_slot;
    return {};
  }
  // Remove what prepare made. Called once, after stop_all.
  virtual void release() = 0;

 protected:
  // Ask the fence (when there is one) before a command with effects; false
  // with *error naming `kind` when refused.
  bool may(const std::string& kind, const nlohmann::json& record, std::string* error);
  nlohmann::json attempt_;  // set_attempt's
  std::function<nlohmann::json()> report_;

 private:
  Fence fence_;
  bool fenced_off_ = false;
};

inline bool Backend::may(const std::string& kind, const nlohmann::json& record, std::string* error) {
  if (!fence_) return true;
  std::string why;
  const int rc = fence_(kind, record, &why);
  fenced_off_ = rc == BALLAST_EFENCED;
  if (rc == BALLAST_OK) return true;
  *error = kind + " not carried out: " + why;
  return false;
}

}  // namespace ballast::runner
