// The Slurm backend: the job is one batch job (sbatch --requeue) on the
// job's nodes; each attempt after the first is the same job requeued and
// released onto exactly the nodes of the attempt (ReqNodeList), away from the
// drained ones (ExcNodeList), at once (StartTime=now). A slot is a Slurm
// node: the job's nodes first, then the warm spares held in a reservation.
//   evict   = scontrol update NodeName=X State=DRAIN Reason=<the fault>
//   restart = stop_all (scontrol requeue, wait for PENDING) + launch (release)
//   replace = the spare the placement plan chose leaves the reservation and
//             is in the next launch's node list
//   restore = State=RESUME, and back into the reservation as a spare, when
//             the node's agent is heard again (node.back), not on a timer
// Every operation whose commands change Slurm's state (submit with the
// spares' reservation, release, requeue, drain, resume, signal, cancel) asks
// the fence first (Backend::may: plugin.h's fence_action), and runs none of
// its commands when refused. A controller that begins to lead takes over
// the job an earlier leader submitted (take_over: the records of etcd's
// action log): the same Slurm job (its id from squeue --json), the slots,
// the last attempt's nodes and the nodes drained and not resumed. Its run is
// re-attached to (reattach) when Slurm runs it as the records say and no
// action was in flight; else the job is requeued (fenced) and restarted by
// the new executor from its newest checkpoint. A job of the same name in Slurm that the log does not show
// submitted is not submitted again, nor adopted. After each launch, and
// before a record when kSnapshotEvery records came since the last, the
// backend records its whole state (slurm.snapshot: the slots, the attempt's
// nodes, run and executor's attempt, the drained nodes, the stopped ranks,
// the spares' reservation, and the executor's report figures: handover.hpp),
// which replaces its earlier records in the log: the log of a job that runs
// for months stays at most 1 + kSnapshotEvery of its records. While the job
// trains undisturbed it is recorded every job.slurm.snapshot_seconds too (refresh), so
// that what a successor carries on is at most that old.
// Ranks are started by a script per node in the job folder (which the nodes
// share), through one srun step per run; each rank's pid and exit code come
// back as files there, and the job's state from squeue --json. Liveness is
// not Slurm's: the executor acts on node.silent from Ballast's heartbeats.
#pragma once

#include "backend.hpp"
#include "job_config.hpp"
#include "slurm.hpp"

#include <cstdint>
#include <map>
#include <set>

namespace ballast::runner {

class SlurmBackend : public Backend {
 public:
  SlurmBackend(SlurmConfig config, std::string job_name, int job_nodes);

  const char* name() const override { return "slurm"; }
  bool prepare(int slots, const std::string& job_dir, std::string* error) override;
  std::string slot_name(int slot) const override;
  std::string isolation() const override;
  bool start(int slot, const std::vector<RankLaunch>& ranks, std::string* error) override;
  bool launch(std::string* error) override;
  bool evict(int slot, const std::string& reason, const std::string& cause, std::string* error) override;
  bool acts_outside() const override { return true; }
  bool take_over(const nlohmann::json& log, TakeOver* out, std::string* error) override;
  bool reattach(const std::map<int, int>& rank_slots, std::string* error) override;
  bool restore(int slot, std::string* error) override;
  bool repaired_when_back() const override { return true; }
  bool signal(int rank, int sig) override;
  void stop_all(double grace_s) override;
  std::vector<RankExit> reap() override;
  bool running(int rank) const override;
  pid_t pid(int rank) const override;
  // The ranks run on other machines: no local processes, no helpers.
  std::vector<pid_t> slot_processes(int slot) const override;
  pid_t spawn_helper(int slot, void (*fn)()) override;
  void stop_helpers(int slot) override { (void)slot; }
  void release() override;
  void refresh() override;

  long job_id() const { return job_; }
  static constexpr int kSnapshotEvery = 16;

 private:
  struct Rank {
    int slot = -1;
    pid_t pid = -1;  // on its node, once its script wrote it
  };
  bool choose_nodes(int standby, std::string* error);
  bool not_submitted(std::string* error);
  bool adopt(const std::vector<nlohmann::json>& records, long id, TakeOver* out, std::string* error);
  // Backend::may, a snapshot first when kSnapshotEvery records came since the last.
  bool fence(const std::string& kind, const nlohmann::json& record, std::string* error);
  void snapshot();
  std::string reattachable(const slurm::JobInfo& info, int run, const nlohmann::json& attempt,
                           const std::string& in_flight);
  std::string run_dir() const { return dir_ + "/run-" + std::to_string(run_); }
  void read_pids();

  slurm::Slurm slurm_;
  SlurmConfig cfg_;
  std::string job_name_;
  int job_nodes_;
  std::string dir_;  // <job folder>/slurm
  int slots_ = 0;
  bool nodes_deferred_ = false;     // a job of this name was in Slurm at prepare: the nodes come from take_over
  std::vector<std::string> names_;  // slot -> node
  std::map<int, bool> drained_;     // slots this job drained -> for node.silent
  std::vector<std::string> nodes_;  // the current attempt's
  int since_snapshot_ = 0;          // records fenced since the last slurm.snapshot
  int64_t snapshot_tried_ns_ = 0;   // steady clock of the last slurm.snapshot tried
  bool hold_spares_ = false;        // the spares' reservation is to be made at the first launch
  bool made_reservation_ = false;
  long job_ = 0;
  int run_ = -1;                    // the run folder of the current attempt
  std::vector<int> pending_slots_;  // slots given their ranks since the last launch
  std::map<int, Rank> ranks_;       // ranks of the current attempt not yet reaped
  int64_t next_files_ns_ = 0, next_state_ns_ = 0;
  bool seen_running_ = false;  // the current attempt's run was seen RUNNING
  std::set<int> stopped_;      // ranks of the current attempt sent SIGSTOP and no SIGCONT since
  std::string stop_error_;     // why the last stop_all could not requeue
};

}  // namespace ballast::runner
