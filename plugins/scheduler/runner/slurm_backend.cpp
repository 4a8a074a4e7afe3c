#include "slurm_backend.hpp"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ballast::runner {

namespace {

namespace fs = std::filesystem;

int64_t mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A word for bash, in single quotes.
std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Written whole under another name, then renamed: a reader never sees half.
bool write_atomic(const std::string& path, const std::string& text, std::string* error) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.flush()) {
      *error = "cannot write " + tmp + ": " + std::strerror(errno);
      return false;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) *error = "cannot rename " + tmp + ": " + ec.message();
  return !ec;
}

bool read_number(const std::string& path, long* out) {
  std::ifstream in(path);
  long v = 0;
  if (!(in >> v)) return false;
  *out = v;
  return true;
}

}  // namespace

SlurmBackend::SlurmBackend(SlurmConfig config, std::string job_name, int job_nodes)
    : slurm_(config.conf, int(config.command_timeout_s * 1000)),
      cfg_(std::move(config)),
      job_name_(std::move(job_name)),
      job_nodes_(job_nodes) {}

std::string SlurmBackend::slot_name(int slot) const {
  return slot >= 0 && slot < int(names_.size()) ? names_[size_t(slot)] : "node" + std::to_string(slot);
}

std::string SlurmBackend::isolation() const {
  return "Slurm batch job" + (job_ ? " " + std::to_string(job_) : std::string()) + " on " +
         slurm::join(std::vector<std::string>(names_.begin(), names_.begin() + job_nodes_)) +
         ", spares in reservation " + cfg_.reservation;
}

std::vector<pid_t> SlurmBackend::slot_processes(int) const { return {}; }

pid_t SlurmBackend::spawn_helper(int, void (*)()) { return -1; }

bool SlurmBackend::choose_nodes(int standby, std::string* error) {
  std::vector<slurm::NodeInfo> all;
  if (!slurm_.nodes(&all, error)) return false;
  auto find = [&](const std::string& name) -> const slurm::NodeInfo* {
    for (const auto& n : all)
      if (n.name == name) return &n;
    return nullptr;
  };
  std::vector<std::string> held;
  if (!slurm_.reservation_nodes(cfg_.reservation, &held, error)) return false;
  std::vector<std::string> spares;
  if (!cfg_.spares.empty()) {
    for (const auto& s : cfg_.spares)
      if (!find(s)) {
        *error = "job.slurm.spares: Slurm has no node '" + s + "'";
        return false;
      }
    if (held.empty()) {
      hold_spares_ = true;  // by the first launch, which asks the fence
    } else if (held != cfg_.spares) {
      *error = "job.slurm.reservation: " + cfg_.reservation + " exists and holds " + slurm::join(held) +
               ", not the spares " + slurm::join(cfg_.spares);
      return false;
    }
    spares = cfg_.spares;
  } else if (standby > 0) {
    if (int(held.size()) < standby) {
      *error = "job.slurm.reservation: " + cfg_.reservation + " holds " + std::to_string(held.size()) +
               " node(s) for standby = " + std::to_string(standby) + " (or name them in job.slurm.spares)";
      return false;
    }
    spares.assign(held.begin(), held.begin() + standby);
  }
  std::vector<std::string> nodes = cfg_.nodes;
  if (nodes.empty()) {
    for (const auto& n : all) {
      if (int(nodes.size()) == job_nodes_) break;
      const bool free = lower(n.state) == "idle" && !n.drained() &&
                        std::find(held.begin(), held.end(), n.name) == held.end() &&
                        std::find(spares.begin(), spares.end(), n.name) == spares.end();
      if (free) nodes.push_back(n.name);
    }
    if (int(nodes.size()) < job_nodes_) {
      *error = "Slurm has " + std::to_string(nodes.size()) + " idle node(s) outside the reservation " +
               cfg_.reservation + "; the job needs " + std::to_string(job_nodes_);
      return false;
    }
  }
  for (const auto& n : nodes) {
    const auto* info = find(n);
    if (!info) {
      *error = "job.slurm.nodes: Slurm has no node '" + n + "'";
      return false;
    }
    if (info->drained() || std::find(spares.begin(), spares.end(), n) != spares.end()) {
      *error = "job.slurm.nodes: " + n + " is " + (info->drained() ? "drained (" + info->reason + ")" : "a spare");
      return false;
    }
  }
  names_ = nodes;
  names_.insert(names_.end(), spares.begin(), spares.end());
  return true;
}

bool SlurmBackend::prepare(int slots, const std::string& job_dir, std::string* error) {
  if (slots < job_nodes_ || job_nodes_ < 1) {
    *error = "slurm backend: " + std::to_string(slots) + " slots for " + std::to_string(job_nodes_) + " nodes";
    return false;
  }
  dir_ = job_dir + "/slurm";
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    *error = "cannot make " + dir_ + ": " + ec.message();
    return false;
  }
  slots_ = slots;
  // A job of this name in Slurm already (an earlier leader's, to be taken
  // over): its nodes come from the action log (take_over), not chosen now.
  std::vector<slurm::JobInfo> named;
  if (!slurm_.jobs_named(job_name_, &named, error)) return false;
  nodes_deferred_ = std::any_of(named.begin(), named.end(), [](const slurm::JobInfo& j) { return !j.finished(); });
  if (nodes_deferred_) {
    names_ = cfg_.nodes;
    names_.insert(names_.end(), cfg_.spares.begin(), cfg_.spares.end());
    for (int s = int(names_.size()); s < slots; ++s) names_.push_back("node" + std::to_string(s));
    names_.resize(size_t(slots));
  } else if (!choose_nodes(slots - job_nodes_, error)) {
    return false;
  }
  // One srun step per run starts every node's script for the attempt named in `current`.
  const std::string script =
      "#!/bin/bash\n"
      "# A Ballast job under Slurm, written by the executor's Slurm backend. Each run of this batch job\n"
      "# (the first and every requeue) starts the ranks of the attempt named in `current`.\n"
      "d=" +
      quote(dir_) +
      "\n"
      "run=$(cat \"$d/current\")\n"
      "echo \"ballast: run $run, restart ${SLURM_RESTART_COUNT:-0}, nodes $SLURM_JOB_NODELIST\"\n"
      "exec srun --kill-on-bad-exit=0 -N \"$SLURM_JOB_NUM_NODES\" --ntasks-per-node=1 /bin/bash -c "
      "'exec /bin/bash \"$0/run-$1/$SLURMD_NODENAME.sh\"' \"$d\" \"$run\"\n";
  if (!write_atomic(dir_ + "/job.sh", script, error)) return false;
  fs::permissions(dir_ + "/job.sh", fs::perms::owner_all, fs::perm_options::add, ec);
  return true;
}

bool SlurmBackend::start(int slot, const std::vector<RankLaunch>& ranks, std::string* error) {
  if (slot < 0 || slot >= int(names_.size())) {
    *error = "slurm backend: no slot " + std::to_string(slot);
    return false;
  }
  std::error_code ec;
  if (pending_slots_.empty()) {
    ++run_;
    fs::create_directories(run_dir(), ec);
    if (ec) {
      *error = "cannot make " + run_dir() + ": " + ec.message();
      return false;
    }
  }
  // Each rank leads a session of its own (its group is what signal() reaches);
  // its pid and, when it ends, its exit code are written beside the script.
  std::string s =
      "#!/bin/bash\n"
      "# Run " +
      std::to_string(run_) + " on " + names_[size_t(slot)] +
      ", written by the executor's Slurm backend.\n"
      "d=" +
      quote(run_dir()) +
      "\n"
      "rank() {  # RANK LOG ARGV...\n"
      "  local r=$1 log=$2; shift 2\n"
      "  setsid \"$@\" >>\"$log\" 2>&1 </dev/null &\n"
      "  local pid=$!\n"
      "  echo $pid >\"$d/pid-$r.tmp\" && mv \"$d/pid-$r.tmp\" \"$d/pid-$r\"\n"
      "  wait $pid; local rc=$?\n"
      "  echo $rc >\"$d/exit-$r.tmp\" && mv \"$d/exit-$r.tmp\" \"$d/exit-$r\"\n"
      "}\n";
  for (const auto& r : ranks) {
    s += "(";
    for (const auto& [k, v] : r.env) s += " export " + k + "=" + quote(v) + ";";
    s += " rank " + std::to_string(r.rank) + " " + quote(r.log_path.empty() ? "/dev/null" : r.log_path);
    for (const auto& a : r.argv) s += " " + quote(a);
    s += ") &\n";
  }
  s += "wait\n";
  if (!write_atomic(run_dir() + "/" + names_[size_t(slot)] + ".sh", s, error)) return false;
  for (const auto& r : ranks) ranks_[r.rank] = Rank{slot, -1};
  pending_slots_.push_back(slot);
  return true;
}

bool SlurmBackend::launch(std::string* error) {
  std::vector<std::string> nodes, exclude;
  for (int s : pending_slots_) nodes.push_back(names_[size_t(s)]);
  for (const auto& [s, silent] : drained_) exclude.push_back(names_[size_t(s)]);
  pending_slots_.clear();
  seen_running_ = false;
  next_state_ns_ = 0;
  stopped_.clear();
  const bool submit = job_ == 0;
  nlohmann::json record = {{"job", job_name_}, {"run", run_}, {"nodes", nodes}, {"exclude", exclude}};
  if (!submit) record["slurm_job"] = job_;
  if (!attempt_.is_null()) record["attempt"] = attempt_;
  if (submit) record["slots"] = names_;  // what a successor taking the job over needs
  if (submit && hold_spares_) record["spares"] = {{"reservation", cfg_.reservation}, {"nodes", cfg_.spares}};
  bool ok = fence(submit ? "slurm.submit" : "slurm.release", record, error) && (!submit || not_submitted(error)) &&
            write_atomic(dir_ + "/current", std::to_string(run_) + "\n", error);
  if (ok && submit && hold_spares_) {
    ok = slurm_.hold_spares(cfg_.reservation, cfg_.spares, error);
    made_reservation_ = ok;
    hold_spares_ = !ok;
  }
  ok = ok && slurm_.unreserve(cfg_.reservation, nodes, error);  // a spare taking a node's place
  if (ok && submit) {
    std::vector<std::string> args = {"-J",
                                     job_name_,
                                     "--requeue",
                                     "-N",
                                     std::to_string(nodes.size()),
                                     "--nodelist=" + slurm::join(nodes),
                                     "-o",
                                     dir_ + "/job.out",
                                     "--open-mode=append"};
    if (!exclude.empty()) args.push_back("--exclude=" + slurm::join(exclude));
    if (!cfg_.partition.empty()) args.push_back("--partition=" + cfg_.partition);
    args.insert(args.end(), cfg_.sbatch_args.begin(), cfg_.sbatch_args.end());
    args.push_back(dir_ + "/job.sh");
    ok = slurm_.submit(args, &job_, error);
  } else if (ok) {
    slurm::JobInfo info;
    ok = slurm_.job(job_, &info, error);
    // Not requeued by stop_all (its ranks had all ended): requeue it now.
    if (ok && info.state != "PENDING") ok = slurm_.requeue(job_, error);
    ok = ok && slurm_.release(job_, nodes, exclude, error);
  }
  if (ok) {
    nodes_ = nodes;
    snapshot();  // the attempt's state replaces the records before it
  }
  if (!ok) {
    if (!stop_error_.empty()) *error += " (after: " + stop_error_ + ")";
    ranks_.clear();
    if (submit) {  // no job in Slurm ran this run: its folder goes, the next start reuses its number
      std::error_code ec;
      fs::remove_all(run_dir(), ec);
      --run_;
    }
  }
  return ok;
}

bool SlurmBackend::fence(const std::string& kind, const nlohmann::json& record, std::string* error) {
  // A refused snapshot does not hold the operation back: its own record decides (a deposed
  // leader's is refused too).
  if (since_snapshot_ >= kSnapshotEvery) snapshot();
  if (!may(kind, record, error)) return false;
  ++since_snapshot_;
  return true;
}

// Everything a successor needs to take the job over (adopt), in one record
// that replaces this backend's earlier ones in the action log. A refusal
// (logged and counted by the executor's fence) deletes nothing: the log
// stays whole, and the next launch or record tries again.
void SlurmBackend::snapshot() {
  if (job_ == 0) return;  // nothing submitted: nothing to take over
  snapshot_tried_ns_ = mono_ns();
  nlohmann::json drained = nlohmann::json::array();
  for (const auto& [slot, silent] : drained_) drained.push_back({{"node", names_[size_t(slot)]}, {"silent", silent}});
  nlohmann::json record = {{"job", job_name_}, {"slurm_job", job_}, {"run", run_},
                           {"slots", names_},  {"nodes", nodes_},   {"drained", std::move(drained)}};
  if (made_reservation_) record["spares"] = {{"reservation", cfg_.reservation}, {"nodes", cfg_.spares}};
  if (!attempt_.is_null()) record["attempt"] = attempt_;
  if (!stopped_.empty()) record["stopped"] = stopped_;
  if (report_) record["report"] = report_();
  std::string refused;
  if (may("slurm.snapshot", record, &refused)) since_snapshot_ = 0;
}

void SlurmBackend::refresh() {
  if (double(mono_ns() - snapshot_tried_ns_) >= cfg_.snapshot_s * 1e9) snapshot();
}

// A job of this name in Slurm that take_over did not adopt (no record of
// an earlier leader's submit, or no action log at all) is not this
// executor's: no second one is submitted.
bool SlurmBackend::not_submitted(std::string* error) {
  std::string out;
  if (!slurm_.run({"squeue", "-h", "--name=" + job_name_, "-o", "%i %T"}, &out, error)) return false;
  if (out.find_first_not_of(" \n") == std::string::npos && !nodes_deferred_) return true;
  *error = "Slurm already has a job named " + job_name_ + " (" +
           (out.empty() ? std::string("it had one when this executor started") : out.substr(0, out.find('\n'))) +
           ") that no earlier leader's action log shows submitted: it is not taken over; cancel it "
           "(scancel --name=" +
           job_name_ + ") or name this job otherwise";
  return false;
}

namespace {

// A record's text field, "" when missing or not text.
std::string field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A record's whole-number field, -1 when missing or not a number that fits an int.
int integer(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return -1;
  const int64_t v = it->get<int64_t>();
  return v >= 0 && v <= INT32_MAX ? int(v) : -1;
}

bool names_of(const nlohmann::json& j, std::vector<std::string>* out) {
  if (!j.is_array()) return false;
  out->clear();
  for (const auto& n : j) {
    if (!n.is_string()) return false;
    out->push_back(n.get<std::string>());
  }
  return true;
}

}  // namespace

bool SlurmBackend::take_over(const nlohmann::json& log, TakeOver* out, std::string* error) {
  *out = TakeOver{};
  if (!log.is_array()) {
    *error = "controller.leader: 'log' is not an array";
    return false;
  }
  // This job's records since its last end (a slurm.cancel ends a run of
  // the job under its leader: what came before is done), oldest first.
  std::vector<nlohmann::json> records;
  for (const auto& r : log) {
    if (!r.is_object() || !r.contains("record") || !r["record"].is_object()) continue;
    const std::string kind = field(r, "kind");
    if (kind.rfind("slurm.", 0) != 0 || field(r["record"], "job") != job_name_) continue;
    if (kind == "slurm.cancel") {
      records.clear();
      continue;
    }
    nlohmann::json rec = r["record"];
    rec["kind"] = kind;
    records.push_back(std::move(rec));
  }
  const bool submitted = std::any_of(records.begin(), records.end(), [](const nlohmann::json& r) {
    return r["kind"] == "slurm.submit" || r["kind"] == "slurm.snapshot";
  });
  if (!submitted) {
    // Nothing of this job's: a fresh start (refused at submit when Slurm has a job of its name).
    if (nodes_deferred_) {
      std::vector<slurm::JobInfo> named;
      if (!slurm_.jobs_named(job_name_, &named, error)) return false;
      if (std::all_of(named.begin(), named.end(), [](const slurm::JobInfo& j) { return j.finished(); })) {
        if (!choose_nodes(slots_ - job_nodes_, error)) return false;
        nodes_deferred_ = false;
      }
    }
    out->slots = names_;
    return true;
  }
  std::vector<slurm::JobInfo> named, live;
  if (!slurm_.jobs_named(job_name_, &named, error)) return false;
  for (const auto& j : named)
    if (!j.finished()) live.push_back(j);
  long logged = 0;  // the Slurm job the log names last
  for (const auto& r : records)
    if (r.contains("slurm_job") && r["slurm_job"].is_number_integer() && r["slurm_job"].get<long>() != 0)
      logged = r["slurm_job"].get<long>();
  if (live.size() > 1) {
    *error = "Slurm has " + std::to_string(live.size()) + " jobs named " + job_name_ + " (" +
             std::to_string(live[0].id) + ", " + std::to_string(live[1].id) + "): none is taken over";
    return false;
  }
  if (live.empty()) {
    out->outcome = TakeOver::ended;
    std::string was;
    for (const auto& j : named)
      if (logged == 0 || j.id == logged) was = " (" + std::to_string(j.id) + " " + j.state + ")";
    out->detail = "the Slurm job " + job_name_ + (logged ? " " + std::to_string(logged) : std::string()) +
                  " that an earlier leader submitted is no longer running" + (was.empty() ? "" : was) +
                  ": it ended or was cancelled, and is not submitted again";
    return true;
  }
  if (logged != 0 && logged != live[0].id) {
    *error = "Slurm's job named " + job_name_ + " is " + std::to_string(live[0].id) + ", the action log's is " +
             std::to_string(logged) + ": not taken over";
    return false;
  }
  return adopt(records, live[0].id, out, error);
}

// The job an earlier leader ran, carried on: its slots and last attempt
// from the log, its run stopped (requeued, fenced) for this executor to
// start the next one.
bool SlurmBackend::adopt(const std::vector<nlohmann::json>& records, long id, TakeOver* out, std::string* error) {
  const std::string where = "the action log's records of " + job_name_;
  std::vector<std::string> names, nodes;
  int run = -1;
  bool made_reservation = false;
  nlohmann::json attempt;  // the last launch record's, while no action followed it
  nlohmann::json report;   // the newest snapshot's
  std::string in_flight;   // an action recorded after the last launch
  std::set<int> stopped;   // ranks sent SIGSTOP since the last launch, and no SIGCONT
  for (const auto& r : records) {
    const std::string kind = r["kind"];
    if (kind == "slurm.requeue" || kind == "slurm.drain") in_flight = kind + " " + r.dump();
    // Ranks stopped (a pause, an injected hang) and not continued since.
    if (kind == "slurm.signal" && integer(r, "signal") == SIGSTOP) stopped.insert(integer(r, "rank"));
    if (kind == "slurm.signal" && integer(r, "signal") == SIGCONT) stopped.erase(integer(r, "rank"));
    if (kind == "slurm.snapshot" && r.contains("stopped") && r["stopped"].is_array())
      for (const auto& x : r["stopped"])
        if (x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= INT32_MAX)
          stopped.insert(int(x.get<int64_t>()));
    if (kind == "slurm.snapshot" && !names_of(r.value("slots", nlohmann::json()), &names)) {
      *error = where + ": a slurm.snapshot record without its slots as a list of names";
      return false;
    }
    if (kind == "slurm.snapshot") {
      made_reservation = r.contains("spares");
      report = r.value("report", nlohmann::json());
    }
    if (kind == "slurm.submit") {
      std::vector<std::string> spares;
      if (!names_of(r.value("slots", nlohmann::json()), &names)) {
        if (!names_of(r.value("nodes", nlohmann::json()), &names) ||
            (r.contains("spares") && !names_of(r["spares"].value("nodes", nlohmann::json()), &spares))) {
          *error = where + ": a slurm.submit record without its slots (or nodes) as a list of names";
          return false;
        }
        names.insert(names.end(), spares.begin(), spares.end());
      }
      made_reservation = r.contains("spares");
    }
    if (kind == "slurm.submit" || kind == "slurm.release" || kind == "slurm.snapshot") {
      if (!names_of(r.value("nodes", nlohmann::json()), &nodes) || !r.contains("run") ||
          !r["run"].is_number_integer()) {
        *error = where + ": a " + kind + " record without its nodes (a list of names) or its run (a number)";
        return false;
      }
      run = r["run"].get<int>();
      attempt = r.value("attempt", nlohmann::json());
      in_flight.clear();
      if (kind != "slurm.snapshot") stopped.clear();
    }
  }
  if (int(names.size()) != slots_) {
    *error = where + ": " + std::to_string(names.size()) + " slots, and this job has " + std::to_string(slots_) +
             " (ranks / ranks_per_node + standby): is it the same job table?";
    return false;
  }
  auto slot_of = [&](const std::string& n) {
    auto it = std::find(names.begin(), names.end(), n);
    return it == names.end() ? -1 : int(it - names.begin());
  };
  out->active.clear();
  for (const auto& n : nodes) out->active.push_back(slot_of(n));
  if (int(nodes.size()) != job_nodes_ || std::count(out->active.begin(), out->active.end(), -1) > 0) {
    *error = where + ": the last attempt's nodes " + slurm::join(nodes) + " are not " + std::to_string(job_nodes_) +
             " of the job's slots " + slurm::join(names);
    return false;
  }
  out->drained.clear();
  for (const auto& r : records) {
    if (r["kind"] == "slurm.snapshot") {  // the drained nodes as of the snapshot
      out->drained.clear();
      const auto drained = r.value("drained", nlohmann::json());
      if (!drained.is_array()) {
        *error = where + ": a slurm.snapshot record without its drained nodes (a list)";
        return false;
      }
      for (const auto& d : drained) {
        const int slot = d.is_object() ? slot_of(field(d, "node")) : -1;
        if (slot < 0) {
          *error = where + ": a slurm.snapshot's drained node " + d.dump() + " is not one of the job's slots";
          return false;
        }
        out->drained[slot] = d.value("silent", false);
      }
      continue;
    }
    const int slot = slot_of(field(r, "node"));
    if (r["kind"] == "slurm.drain" && slot >= 0) out->drained[slot] = field(r, "cause") == "node.silent";
    if (r["kind"] == "slurm.resume" && slot >= 0) out->drained.erase(slot);
  }
  names_ = names;
  job_ = id;
  run_ = run;
  made_reservation_ = made_reservation;
  hold_spares_ = false;
  nodes_deferred_ = false;
  ranks_.clear();
  pending_slots_.clear();
  drained_.clear();
  std::vector<std::string> drained;
  nodes_ = nodes;
  since_snapshot_ = int(records.size());  // the predecessors' records: replaced by this backend's first snapshot
  for (const auto& [slot, silent] : out->drained) {
    drained_[slot] = silent;
    drained.push_back(names_[size_t(slot)]);
  }
  slurm::JobInfo info;
  if (!slurm_.job(id, &info, error)) return false;
  for (const auto& [slot, silent] : out->drained)
    if (in_flight.empty() && std::find(nodes.begin(), nodes.end(), names[size_t(slot)]) != nodes.end())
      in_flight = "the attempt's node " + names[size_t(slot)] + " is drained (an evict in flight)";
  if (in_flight.empty() && !stopped.empty())
    in_flight =
        "ranks stopped (SIGSTOP: a pause, an injected hang) and not continued: " + nlohmann::json(stopped).dump();
  out->restart = reattachable(info, run, attempt, in_flight);
  if (out->restart.empty()) {
    out->attempt = attempt;
    attempt_ = attempt;
  } else if (info.state != "PENDING") {
    // Its run stops (Slurm's SIGTERM, KillWait, SIGKILL); this executor starts the next one.
    // Not fence(): a snapshot now would carry this executor's report before it took the earlier one over.
    if (!may("slurm.requeue", {{"job", job_name_}, {"slurm_job", id}, {"takeover", true}}, error)) return false;
    ++since_snapshot_;
    if (!slurm_.requeue(id, error)) return false;
  }
  out->outcome = TakeOver::adopted;
  out->report = report;
  out->slots = names_;
  out->detail = "Slurm job " + std::to_string(id) + " (" + info.state + ", run " + std::to_string(run) + " on " +
                slurm::join(nodes) + "; drained and not resumed: " + (drained.empty() ? "none" : slurm::join(drained)) +
                ")";
  return true;
}

// Why the adopted job's run cannot be carried on as it runs ("" when it
// can): Slurm runs it on the nodes and in the run of the last launch record,
// which has the attempt, and no requeue or drain (an action in flight at the
// earlier leader) came after it.
std::string SlurmBackend::reattachable(const slurm::JobInfo& info, int run, const nlohmann::json& attempt,
                                       const std::string& in_flight) {
  if (info.state != "RUNNING") return "Slurm has the job " + info.state + ", not RUNNING";
  if (!attempt.is_object()) return "the last launch record has no attempt (an older leader's)";
  if (!in_flight.empty()) return "an action was in flight at the earlier leader: " + in_flight.substr(0, 200);
  std::vector<std::string> running, recorded = nodes_;
  std::string why;
  if (!slurm_.expand(info.nodes, &running, &why)) return "Slurm's node list " + info.nodes + ": " + why;
  std::sort(running.begin(), running.end());
  std::sort(recorded.begin(), recorded.end());
  if (running != recorded) return "Slurm runs the job on " + info.nodes + ", the records on " + slurm::join(nodes_);
  long current = -1;
  if (!read_number(dir_ + "/current", &current) || current != run)
    return dir_ + "/current is not the records' run " + std::to_string(run);
  return "";
}

bool SlurmBackend::reattach(const std::map<int, int>& rank_slots, std::string* error) {
  ranks_.clear();
  for (const auto& [rank, slot] : rank_slots) {
    if (slot < 0 || slot >= int(names_.size()) ||
        std::find(nodes_.begin(), nodes_.end(), names_[size_t(slot)]) == nodes_.end()) {
      *error = "rank " + std::to_string(rank) + " on slot " + std::to_string(slot) + ", not one of the run's nodes";
      ranks_.clear();
      return false;
    }
    ranks_[rank] = Rank{slot, -1};
  }
  read_pids();
  seen_running_ = true;
  next_files_ns_ = next_state_ns_ = 0;
  snapshot();  // the adopted attempt recorded in this leader's term
  return true;
}

bool SlurmBackend::evict(int slot, const std::string& reason, const std::string& cause, std::string* error) {
  // Slurm keeps the reason as one line.
  std::string why = reason;
  std::replace(why.begin(), why.end(), '\n', ' ');
  why = why.substr(0, 256);
  const nlohmann::json record = {
      {"job", job_name_}, {"slurm_job", job_}, {"node", names_[size_t(slot)]}, {"reason", why}, {"cause", cause}};
  if (!fence("slurm.drain", record, error)) return false;
  if (!slurm_.drain(names_[size_t(slot)], why, error)) return false;
  drained_[slot] = cause == "node.silent";
  return true;
}

bool SlurmBackend::restore(int slot, std::string* error) {
  const std::string& node = names_[size_t(slot)];
  std::vector<slurm::NodeInfo> all;
  if (!slurm_.nodes(&all, error)) return false;
  const nlohmann::json record = {{"job", job_name_}, {"node", node}, {"reservation", cfg_.reservation}};
  if (!fence("slurm.resume", record, error)) return false;
  for (const auto& n : all)
    if (n.name == node && n.drained() && !slurm_.resume(node, error)) return false;  // a person may have resumed it
  if (!slurm_.reserve(cfg_.reservation, node, error)) return false;
  drained_.erase(slot);
  return true;
}

void SlurmBackend::read_pids() {
  for (auto& [rank, r] : ranks_) {
    long pid = 0;
    if (r.pid < 0 && read_number(run_dir() + "/pid-" + std::to_string(rank), &pid)) r.pid = pid_t(pid);
  }
}

bool SlurmBackend::signal(int rank, int sig) {
  read_pids();
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || it->second.pid <= 0 || job_ == 0) return false;
  // Through Slurm to the rank's node: a step beside the job's that signals the rank's group.
  std::string error;
  const std::string& node = names_[size_t(it->second.slot)];
  if (!fence("slurm.signal", {{"job", job_name_}, {"slurm_job", job_}, {"node", node}, {"rank", rank}, {"signal", sig}},
             &error))
    return false;
  if (sig == SIGSTOP) stopped_.insert(rank);
  if (sig == SIGCONT) stopped_.erase(rank);
  return slurm_.run({"srun", "--jobid=" + std::to_string(job_), "--overlap", "-N1", "-n1", "-w", node, "kill",
                     "-" + std::to_string(sig), "--", "-" + std::to_string(it->second.pid)},
                    nullptr, &error);
}

void SlurmBackend::stop_all(double) {
  // Slurm's own stop: SIGTERM, KillWait, SIGKILL to every process of the
  // job on every node; the job then waits, PENDING, for launch().
  stop_error_.clear();
  slurm::JobInfo info;
  const bool ran = job_ != 0 && !ranks_.empty() && !(slurm_.job(job_, &info, &stop_error_) && info.state == "PENDING");
  if (ran && !fence("slurm.requeue", {{"job", job_name_}, {"slurm_job", job_}}, &stop_error_)) {
    // Not this controller's to stop any more.
  } else if (ran && !slurm_.requeue(job_, &stop_error_)) {
    std::string ignored;
    slurm_.run({"scancel", "--signal=KILL", "--full", std::to_string(job_)}, nullptr, &ignored);
  }
  ranks_.clear();
  pending_slots_.clear();
}

std::vector<RankExit> SlurmBackend::reap() {
  std::vector<RankExit> out;
  if (ranks_.empty() || !pending_slots_.empty()) return out;
  const int64_t t = mono_ns();
  if (t < next_files_ns_) return out;
  next_files_ns_ = t + 100000000;
  read_pids();
  auto collect = [&] {
    for (auto it = ranks_.begin(); it != ranks_.end();) {
      long code = 0;
      if (!read_number(run_dir() + "/exit-" + std::to_string(it->first), &code)) {
        ++it;
        continue;
      }
      // bash's $? of a rank killed by a signal is 128 + the signal.
      const int status = code > 128 && code < 128 + 65 ? int(code - 128) : int(code & 0xff) << 8;
      out.push_back({it->first, it->second.pid, status});
      it = ranks_.erase(it);
    }
  };
  collect();
  if (ranks_.empty() || t < next_state_ns_) return out;
  next_state_ns_ = t + 1000000000;
  slurm::JobInfo info;
  std::string error;
  const bool known = slurm_.job(job_, &info, &error);
  if (known && info.state == "RUNNING") seen_running_ = true;
  // The run ended (or Slurm requeued it itself) with ranks that wrote no exit code: killed.
  const bool gone = known ? info.finished() || (seen_running_ && info.state == "PENDING")
                          : error.find(": no job ") != std::string::npos;
  if (gone) {
    collect();
    for (const auto& [rank, r] : ranks_) out.push_back({rank, r.pid, SIGKILL});
    ranks_.clear();
  }
  return out;
}

bool SlurmBackend::running(int rank) const {
  auto it = ranks_.find(rank);
  return it != ranks_.end() && it->second.pid > 0;
}

pid_t SlurmBackend::pid(int rank) const {
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? -1 : it->second.pid;
}

void SlurmBackend::release() {
  std::string ignored;
  if (job_ == 0 && !made_reservation_) return;
  nlohmann::json record = {{"job", job_name_}, {"slurm_job", job_}};
  if (made_reservation_) record["reservation"] = cfg_.reservation;
  if (!fence("slurm.cancel", record, &ignored)) return;
  if (job_ != 0) slurm_.cancel(job_, &ignored);
  if (made_reservation_) slurm_.delete_reservation(cfg_.reservation, &ignored);
}

}  // namespace ballast::runner
