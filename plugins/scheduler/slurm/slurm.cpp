#include "slurm.hpp"

#include "subprocess.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <sstream>
#include <thread>

namespace ballast::slurm {

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : sep) + i;
  return out;
}

bool NodeInfo::drained() const { return std::find(flags.begin(), flags.end(), "DRAIN") != flags.end(); }

Slurm::Slurm(std::string conf, int timeout_ms) : timeout_ms_(timeout_ms) {
  if (!conf.empty()) env_.push_back("SLURM_CONF=" + conf);
}

bool Slurm::run(const std::vector<std::string>& argv, std::string* out, std::string* error) {
  CommandResult r;
  std::string why;
  if (!run_command(argv, env_, timeout_ms_, &r, &why)) {
    *error = join(argv, " ") + ": " + why;
    return false;
  }
  if (r.exit_code != 0) {
    std::string msg = r.err.empty() ? r.out : r.err;
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    *error = join(argv, " ") + ": exit code " + std::to_string(r.exit_code) + ": " + msg;
    return false;
  }
  if (out) *out = std::move(r.out);
  return true;
}

bool Slurm::drain(const std::string& node, const std::string& reason, std::string* error) {
  return run({"scontrol", "update", "NodeName=" + node, "State=DRAIN", "Reason=" + reason}, nullptr, error);
}

bool Slurm::resume(const std::string& node, std::string* error) {
  return run({"scontrol", "update", "NodeName=" + node, "State=RESUME"}, nullptr, error);
}

bool Slurm::wait_state(long job, const std::string& state, std::string* error) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  JobInfo info;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!this->job(job, &info, error)) return false;
    if (info.state == state) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  *error = "job " + std::to_string(job) + " not " + state + " after " + std::to_string(timeout_ms_) + " ms (it is " +
           info.state + ")";
  return false;
}

bool Slurm::requeue(long job, std::string* error) {
  if (!run({"scontrol", "requeue", std::to_string(job)}, nullptr, error)) return false;
  // Requeue is asynchronous: an update sent before PENDING is overwritten.
  return wait_state(job, "PENDING", error);
}

bool Slurm::release(long job, const std::vector<std::string>& nodelist, const std::vector<std::string>& exclude,
                    std::string* error) {
  // The next launch credential must be dated after the second in which the
  // requeue revoked the last one, or slurmd refuses it and the job ends
  // FAILED ("Job credential revoked"). A requeue sets submit_time to its
  // own time (slurmctld's clock): wait until that second is over, then let
  // the job start now. (A StartTime in the future would wait for Slurm's
  // periodic scheduling pass, up to a minute.)
  JobInfo info;
  if (!this->job(job, &info, error)) return false;
  const auto until = std::chrono::system_clock::from_time_t(std::time_t(info.submit_time + 1));
  const auto longest = std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_);
  std::this_thread::sleep_until(std::min(until, longest));
  return run({"scontrol", "update", "JobId=" + std::to_string(job), "ExcNodeList=" + join(exclude),
              "ReqNodeList=" + join(nodelist), "StartTime=now"},
             nullptr, error);
}

bool Slurm::requeue_excluding(long job, const std::vector<std::string>& exclude, std::string* error) {
  return requeue(job, error) && release(job, {}, exclude, error);
}

bool Slurm::hold_spares(const std::string& reservation, const std::vector<std::string>& nodes, std::string* error) {
  return run({"scontrol", "create", "reservation", "ReservationName=" + reservation, "Nodes=" + join(nodes),
              "StartTime=now", "Duration=infinite", "Users=root", "Flags=maint,ignore_jobs"},
             nullptr, error);
}

bool Slurm::reservation_nodes(const std::string& reservation, std::vector<std::string>* out, std::string* error) {
  out->clear();
  std::string text;
  if (!run({"scontrol", "show", "reservation", reservation, "-o"}, &text, error))
    return error->find("not found") != std::string::npos;
  size_t at = text.find(" Nodes=");
  if (at == std::string::npos) {
    *error = "reservation " + reservation + ": no Nodes= in: " + text.substr(0, 200);
    return false;
  }
  std::string list = text.substr(at + 7, text.find(' ', at + 7) - at - 7);
  return expand(list, out, error);
}

bool Slurm::delete_reservation(const std::string& reservation, std::string* error) {
  return run({"scontrol", "delete", "ReservationName=" + reservation}, nullptr, error);
}

bool Slurm::unreserve(const std::string& reservation, const std::vector<std::string>& nodes, std::string* error) {
  std::vector<std::string> held;
  if (!reservation_nodes(reservation, &held, error)) return false;
  std::vector<std::string> keep;
  for (const auto& n : held)
    if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) keep.push_back(n);
  if (keep.size() == held.size()) return true;
  if (keep.empty()) return delete_reservation(reservation, error);
  return run({"scontrol", "update", "ReservationName=" + reservation, "Nodes=" + join(keep)}, nullptr, error);
}

bool Slurm::reserve(const std::string& reservation, const std::string& node, std::string* error) {
  std::vector<std::string> held;
  if (!reservation_nodes(reservation, &held, error)) return false;
  if (held.empty()) return hold_spares(reservation, {node}, error);
  if (std::find(held.begin(), held.end(), node) != held.end()) return true;
  held.push_back(node);
  return run({"scontrol", "update", "ReservationName=" + reservation, "Nodes=" + join(held)}, nullptr, error);
}

bool Slurm::requeue_onto(long job, const std::string& reservation, const std::vector<std::string>& nodelist,
                         std::string* error) {
  if (!reservation.empty() && !unreserve(reservation, nodelist, error)) return false;
  return requeue(job, error) && release(job, nodelist, {}, error);
}

namespace {

JobInfo job_info(const nlohmann::json& job) {
  JobInfo out;
  out.id = job["job_id"].get<long>();
  out.name = job.value("name", "");
  out.state = job.value("job_state", "");
  out.nodes = job.value("nodes", "");
  out.restarts = job.value("restart_cnt", 0);
  out.reason = job.value("state_reason", "");
  out.submit_time = job.value("submit_time", 0LL);
  return out;
}

// squeue --json ARGS: its "jobs", each with a numeric job_id.
bool squeue_jobs(Slurm& slurm, const std::vector<std::string>& args, std::vector<JobInfo>* out, std::string* error) {
  std::vector<std::string> argv = {"squeue", "--json"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string text;
  if (!slurm.run(argv, &text, error)) return false;
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("jobs") || !j["jobs"].is_array()) {
    *error = "squeue --json: not the expected JSON: " + text.substr(0, 200);
    return false;
  }
  out->clear();
  try {
    for (const auto& job : j["jobs"])
      if (job.is_object() && job.contains("job_id") && job["job_id"].is_number_integer()) out->push_back(job_info(job));
  } catch (const nlohmann::json::exception& e) {
    *error = std::string("squeue --json: a job's fields are not of the expected types: ") + e.what();
    return false;
  }
  return true;
}

}  // namespace

bool JobInfo::finished() const {
  return state != "PENDING" && state != "RUNNING" && state != "CONFIGURING" && state != "COMPLETING" &&
         state != "SUSPENDED" && state != "REQUEUED" && state != "RESIZING" && state != "SIGNALING" &&
         state != "STAGE_OUT";
}

bool Slurm::job(long id, JobInfo* out, std::string* error) {
  std::vector<JobInfo> all;
  if (!squeue_jobs(*this, {"-j", std::to_string(id)}, &all, error)) return false;
  for (const auto& j : all)
    if (j.id == id) {
      *out = j;
      return true;
    }
  *error = "squeue --json: no job " + std::to_string(id);
  return false;
}

bool Slurm::jobs_named(const std::string& name, std::vector<JobInfo>* out, std::string* error) {
  std::vector<JobInfo> all;
  if (!squeue_jobs(*this, {}, &all, error)) return false;
  out->clear();
  for (auto& j : all)
    if (j.name == name) out->push_back(std::move(j));
  return true;
}

bool Slurm::nodes(std::vector<NodeInfo>* out, std::string* error) {
  std::string text;
  if (!run({"sinfo", "--json"}, &text, error)) return false;
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("nodes") || !j["nodes"].is_array()) {
    *error = "sinfo --json: not the expected JSON: " + text.substr(0, 200);
    return false;
  }
  out->clear();
  for (const auto& n : j["nodes"]) {
    NodeInfo info;
    info.name = n.value("name", "");
    info.state = n.value("state", "");
    info.reason = n.value("reason", "");
    if (n.contains("state_flags") && n["state_flags"].is_array())
      for (const auto& f : n["state_flags"])
        if (f.is_string()) info.flags.push_back(f.get<std::string>());
    out->push_back(std::move(info));
  }
  return true;
}

bool Slurm::submit(const std::vector<std::string>& args, long* id, std::string* error) {
  std::vector<std::string> argv = {"sbatch", "--parsable"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string text;
  if (!run(argv, &text, error)) return false;
  try {
    *id = std::stol(text.substr(0, text.find(';')));
  } catch (...) {
    *error = "sbatch --parsable: no job id in '" + text + "'";
    return false;
  }
  return true;
}

bool Slurm::cancel(long job, std::string* error) { return run({"scancel", std::to_string(job)}, nullptr, error); }

bool Slurm::expand(const std::string& hostlist, std::vector<std::string>* out, std::string* error) {
  std::string text;
  if (!run({"scontrol", "show", "hostnames", hostlist}, &text, error)) return false;
  out->clear();
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out->push_back(line);
  return true;
}

}  // namespace ballast::slurm
