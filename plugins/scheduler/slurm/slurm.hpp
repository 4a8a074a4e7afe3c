// Slurm as the resource manager that carries out Ballast's actions, through
// its commands as subprocesses (scontrol, sbatch, squeue --json,
// sinfo --json; not libslurm, whose ABI changes every release). Every call
// checks the exit code and names the command and Slurm's message on failure.
// Slurm is not the liveness source (it marks a dead node down after ~30 s):
// the caller decides from Ballast's heartbeats and asks this class to act.
//   evict   = drain(node, reason)
//   restart = requeue_excluding(job, nodes): requeue, wait until PENDING,
//             then, once the requeue's second is over, ExcNodeList +
//             StartTime=now (a requeued job otherwise waits ~120 s; an update
//             sent before PENDING is overwritten; a job started within the
//             requeue's second fails: its credential counts as revoked)
//   replace = hold_spares(reservation, nodes) beforehand, then
//             requeue_onto(job, reservation, nodelist): the spares leave the
//             reservation and the job is pinned (ReqNodeList) to the
//             placement plan's nodes
//   resume  = resume(node)
// Thread-safety: none; one per thread.
#pragma once

#include <string>
#include <vector>

namespace ballast::slurm {

struct JobInfo {
  long id = 0;
  std::string state;  // PENDING, RUNNING, COMPLETED, ...
  std::string nodes;  // hostlist, "" while pending
  int restarts = 0;
  std::string reason;
  long long submit_time = 0;  // Unix seconds, slurmctld's clock; a requeue sets it to its own time
  std::string name;
  // Whether its processes are gone for good (COMPLETED, CANCELLED, FAILED, ...).
  bool finished() const;
};

struct NodeInfo {
  std::string name;
  std::string state;               // idle, allocated, mixed, down, ...
  std::vector<std::string> flags;  // DRAIN, ...
  std::string reason;
  bool drained() const;
};

class Slurm {
 public:
  // conf: the slurm.conf to use (SLURM_CONF), "" = Slurm's default.
  explicit Slurm(std::string conf = "", int timeout_ms = 15000);

  bool drain(const std::string& node, const std::string& reason, std::string* error);
  bool resume(const std::string& node, std::string* error);
  bool requeue_excluding(long job, const std::vector<std::string>& exclude, std::string* error);
  // The two halves of a requeue: requeue(job) kills the run and waits until
  // the job is PENDING again (Slurm holds it ~120 s); release(job, nodelist,
  // exclude) pins it to exactly `nodelist` ("" = Slurm's choice) away from
  // `exclude` and lets it start now, waiting first (at most a second
  // normally) until the requeue's second is over.
  bool requeue(long job, std::string* error);
  bool release(long job, const std::vector<std::string>& nodelist, const std::vector<std::string>& exclude,
               std::string* error);
  bool hold_spares(const std::string& reservation, const std::vector<std::string>& nodes, std::string* error);
  // The nodes a reservation holds; none (and true) when it does not exist.
  bool reservation_nodes(const std::string& reservation, std::vector<std::string>* out, std::string* error);
  // Take `nodes` out of the reservation (deleted when it empties), or put
  // one back (made again when it was deleted).
  bool unreserve(const std::string& reservation, const std::vector<std::string>& nodes, std::string* error);
  bool reserve(const std::string& reservation, const std::string& node, std::string* error);
  bool delete_reservation(const std::string& reservation, std::string* error);
  // Requeue `job` onto exactly `nodelist` (survivors + spares), after taking
  // the spares among them out of `reservation` (deleted when it empties).
  bool requeue_onto(long job, const std::string& reservation, const std::vector<std::string>& nodelist,
                    std::string* error);
  bool job(long id, JobInfo* out, std::string* error);
  // Every job named `name` that squeue --json lists (ended ones too, while
  // slurmctld keeps them: MinJobAge).
  bool jobs_named(const std::string& name, std::vector<JobInfo>* out, std::string* error);
  bool nodes(std::vector<NodeInfo>* out, std::string* error);
  // sbatch --parsable ARGS...; the job id.
  bool submit(const std::vector<std::string>& args, long* id, std::string* error);
  bool cancel(long job, std::string* error);
  // Every node of a hostlist ("n[1-3],n5"), by scontrol show hostnames.
  bool expand(const std::string& hostlist, std::vector<std::string>* out, std::string* error);

  // Any Slurm command (srun, scancel, ...), checked the same way; its stdout in *out when not null.
  bool run(const std::vector<std::string>& argv, std::string* out, std::string* error);

 private:
  bool wait_state(long job, const std::string& state, std::string* error);
  std::vector<std::string> env_;
  int timeout_ms_;
};

std::string join(const std::vector<std::string>& items, const char* sep = ",");

}  // namespace ballast::slurm
