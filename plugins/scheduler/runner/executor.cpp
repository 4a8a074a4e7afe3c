#include "executor.hpp"

#include "launch_env.hpp"
#include "proc_stat.hpp"
#include "relay.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ballast::runner {

namespace {

namespace fs = std::filesystem;

int64_t wall_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string json_or_empty(const char* s) { return s ? s : ""; }

// Set a variable of a rank's environment, replacing an earlier value.
void set_env(std::vector<std::pair<std::string, std::string>>* env, const std::string& key, const std::string& value) {
  for (auto& [k, v] : *env)
    if (k == key) {
      v = value;
      return;
    }
  env->emplace_back(key, value);
}

// Fault injection helpers run in a forked child of a multi-threaded process:
// system calls only, no allocation through malloc.
void cpu_hog() {
  volatile double x = 1;
  for (;;) x = x * 1.0000001 + 1e-9;
}

void mem_hog() {
  // 1 GiB in 64 MiB steps, every page touched, then kept resident.
  const size_t chunk = 64u << 20, chunks = 16;
  char* mem[chunks] = {};
  size_t got = 0;
  for (; got < chunks; ++got) {
    void* p = mmap(nullptr, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) break;
    mem[got] = static_cast<char*>(p);
    std::memset(mem[got], int(got + 1), chunk);
    usleep(20000);
  }
  for (size_t round = 0; got > 0; ++round) {
    char* p = mem[round % got];
    for (size_t off = 0; off < chunk; off += 4096) p[off]++;
    usleep(100000);
  }
  pause();
}

// CPU seconds of a process (utime + stime), -1 if it is gone.
double cpu_seconds(pid_t pid) {
  util::ProcStat s;
  if (!util::read_proc_stat(int(pid), &s)) return -1;
  return double(s.utime + s.stime) / double(sysconf(_SC_CLK_TCK));
}

// The network counters of a process's namespace, named as the collector
// names their rates: net.IFACE.rx_bytes / tx_bytes / rx_packets /
// tx_packets per interface but the loopback, and net.tcp.retrans. False
// when the process is gone.
bool read_net_counters(pid_t pid, Executor::NetCounters* out) {
  const std::string base = "/proc/" + std::to_string(pid) + "/net/";
  std::ifstream dev(base + "dev");
  if (!dev) return false;
  std::map<std::string, double> c;
  for (std::string line; std::getline(dev, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string iface = line.substr(0, colon);
    iface.erase(0, iface.find_first_not_of(' '));
    if (iface == "lo" || iface.empty()) continue;
    double f[16] = {};
    if (std::sscanf(line.c_str() + colon + 1, "%lf %lf %lf %lf %lf %lf %lf %lf %lf %lf", &f[0], &f[1], &f[2], &f[3],
                    &f[4], &f[5], &f[6], &f[7], &f[8], &f[9]) < 10)
      continue;
    const std::string p = "net." + iface + ".";
    c[p + "rx_bytes"] = f[0];
    c[p + "rx_packets"] = f[1];
    c[p + "tx_bytes"] = f[8];
    c[p + "tx_packets"] = f[9];
  }
  // "Tcp: names..." then "Tcp: values...".
  std::ifstream snmp(base + "snmp");
  for (std::string names, values; std::getline(snmp, names);) {
    if (names.rfind("Tcp:", 0) != 0 || !std::getline(snmp, values)) continue;
    std::istringstream n(names.substr(4)), v(values.substr(4));
    for (std::string key, val; n >> key && v >> val;)
      if (key == "RetransSegs") c["net.tcp.retrans"] = std::strtod(val.c_str(), nullptr);
    break;
  }
  if (c.empty()) return false;
  out->counters = std::move(c);
  return true;
}

double rss_bytes(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/statm", int(pid));
  std::ifstream in(path);
  double size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * double(sysconf(_SC_PAGESIZE));
}

}  // namespace

Executor::Executor(const ballast_host_api* host, JobConfig config, std::unique_ptr<Backend> backend)
    : host_(host),
      cfg_(std::move(config)),
      backend_(std::move(backend)),
      queue_(RetryPolicy{cfg_.action_tries, cfg_.backoff_s}),
      loop_rule_(cfg_.restart_loop_limit) {
  fired_.assign(cfg_.injections.size(), false);
  backend_->set_fence([this](const std::string& kind, const nlohmann::json& record, std::string* why) {
    return fence(kind, record, why);
  });
  backend_->set_report([this] { return handover_json(handover(), kept_); });
}

// plugin.h's fence_action. A host older than ABI 1.2 has no high
// availability: the action may run. A refusal is counted and logged once
// (while waiting to lead, the asks of each second are not).
int Executor::fence(const std::string& kind, const nlohmann::json& record, std::string* why) {
  if (!BALLAST_COVERS(host_->size, ballast_host_api, fence_action)) return BALLAST_OK;
  const std::string json = record.dump();
  const int rc = host_->fence_action(host_, kind.c_str(), json.c_str());
  if (rc == BALLAST_OK) return rc;
  *why = std::string(ballast_status_name(rc)) + ": " + host_->last_error(host_);
  // A refused snapshot deletes nothing: the log keeps the job's earlier
  // records, which a successor still reads until there are too many. Shown
  // even while waiting to lead (a snapshot follows a start the fence let
  // through, the one that ends the wait), bounded: it may recur after
  // every launch and every few records.
  if (kind.ends_with(".snapshot")) {
    host_->counter_add(host_, "snapshots_refused", 1);
    if (log_refusal(++snapshots_refused_))
      log(BALLAST_LOG_WARN, "job " + cfg_.name + ": " + kind + " of " + std::to_string(json.size()) +
                                " bytes not recorded (" + *why +
                                "); the action log keeps the job's earlier records, the next snapshot tries again (" +
                                std::to_string(snapshots_refused_) + " refused so far)");
    return rc;
  }
  if (waiting_to_lead_) return rc;
  host_->counter_add(host_, "fenced_off", 1);
  log(BALLAST_LOG_WARN, kind + " " + json + " not carried out: " + *why);
  return rc;
}

Executor::~Executor() {
  stop();
  for (int fd : wake_)
    if (fd >= 0) close(fd);
}

void Executor::log(int level, const std::string& msg) {
  if (tty_ && cfg_.progress) std::fputs("\r\033[K", stderr);
  host_->log(host_, level, msg.c_str());
}

int64_t Executor::now() const { return host_->now_ns ? host_->now_ns(host_) : wall_ns(); }

const char* Executor::state_name(State s) {
  switch (s) {
    case State::starting:
      return "starting";
    case State::running:
      return "running";
    case State::recovering:
      return "recovering";
    case State::paused:
      return "paused";
    case State::finished:
      return "finished";
    case State::escalated:
      return "escalated";
    case State::stopped:
      return "stopped";
    case State::interrupted:
      return "interrupted";
  }
  return "?";
}

bool Executor::start(std::string* error) {
  std::error_code ec;
  if (cfg_.dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/ballast-job-XXXXXX";
    if (!mkdtemp(templ.data())) {
      *error = "cannot make a job folder " + templ + ": " + std::strerror(errno);
      return false;
    }
    job_dir_ = templ;
  } else {
    job_dir_ = cfg_.dir;
    fs::create_directories(job_dir_, ec);
    if (ec) {
      *error = "job.dir: cannot make " + job_dir_ + ": " + ec.message();
      return false;
    }
  }
  checkpoint_dir_ = job_dir_ + "/checkpoints";
  fs::create_directories(checkpoint_dir_, ec);
  fs::create_directories(job_dir_ + "/logs", ec);
  if (trace_dir_.empty() && !prepare_trace_dir(error)) return false;
  fs::create_directories(trace_dir_, ec);
  socket_path_ = job_dir_ + "/job.sock";
  if (socket_path_.size() >= 100) socket_path_ = "/tmp/ballast-" + std::to_string(getpid()) + "-job.sock";
  // Another executor's channel answering there (a controller candidate's
  // leader, still alive): its ranks' reports stay its own. Opened when this
  // one starts the job, once that socket is gone.
  if (!ReportSocket::answers(socket_path_)) {
    if (!open_channel(error, backend_->acts_outside())) return false;
  } else if (!backend_->acts_outside()) {
    *error = "job.dir " + job_dir_ + ": another executor's job channel answers at " + socket_path_;
    return false;
  }
  const int slots = cfg_.nodes() + cfg_.standby;
  if (!backend_->prepare(slots, job_dir_, error)) return false;
  for (const auto& in : cfg_.injections)
    if (in.kind == FaultKind::machine && in.machine_kind == "net" && !backend_->network_per_slot()) {
      *error = in.origin + ": machine kind=net needs a network namespace per node, and this run has none (" +
               backend_->isolation() + ")";
      backend_->release();
      return false;
    }
  for (int s = 0; s < slots; ++s) slots_.push_back({backend_->slot_name(s), SlotState::standby, 0, 0, ""});
  for (int n = 0; n < cfg_.nodes(); ++n) {
    node_slot_.push_back(n);
    slots_[size_t(n)].role = SlotState::active;
  }
  // The placement plugin picks standbys on this topology: one switch.
  write_topology();
  ranks_.assign(size_t(cfg_.ranks), RankState{});
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    *error = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  tty_ = isatty(2) == 1;
  log(BALLAST_LOG_INFO, "job " + cfg_.name + ": " + std::to_string(cfg_.ranks) + " ranks of " + cfg_.command[0] +
                            " in " + job_dir_ + " (" + backend_->name() + " backend, " + backend_->isolation() +
                            "), traces in " + trace_dir_ + ", " + std::to_string(cfg_.injections.size()) +
                            " injection(s)");
  first_start_ns_ = now();
  // A controller candidate (with etcd) is refused every action until it
  // leads (the controller role starts after the plugins): then it waits for
  // its term, and takes over what an earlier leader left (take_over).
  if (backend_->acts_outside() && BALLAST_COVERS(host_->size, ballast_host_api, fence_action))
    ha_ = host_->fence_action(host_, "runner.start", nlohmann::json({{"job", cfg_.name}}).dump().c_str()) != BALLAST_OK;
  std::string why;
  if (ha_ || !start_attempt(Checkpoint{}, &why)) {
    if (!ha_ && !backend_->fenced_off() && !channel_busy_) {
      *error = why;
      return false;
    }
    // A controller candidate that does not lead (yet): the job starts when it does.
    attempt_ = std::max(attempt_, 0);
    waiting_to_lead_ = true;
    next_lead_try_ns_ = now() + kLeadRetryNs;
    set_state(State::starting, ha_ ? "waiting to lead" : "waiting to lead: " + why);
  }
  thread_ = std::thread([this] { loop(); });
  return true;
}

// While waiting to lead: the first start tried again, once a second; with
// high availability only once a term began (controller.leader, whose log
// take_over reads first).
void Executor::try_to_lead() {
  if (now() < next_lead_try_ns_ || (ha_ && terms_seen_ == 0)) return;
  next_lead_try_ns_ = now() + kLeadRetryNs;
  std::string why;
  if (ha_ && taken_over_ != terms_seen_ && !take_over(&why)) {
    if (backend_->fenced_off() || ended_) return;
    waiting_to_lead_ = false;
    end_job(State::escalated, "the job could not be taken over: " + why);
    return;
  }
  if (ended_) return;
  if (adopted_attempt_.is_object()) {
    const nlohmann::json a = std::exchange(adopted_attempt_, nlohmann::json());
    if (reattach(a, &why)) {
      waiting_to_lead_ = false;
      log(BALLAST_LOG_INFO, "this controller leads: re-attached to the running attempt " + std::to_string(attempt_));
      return;
    }
    log(BALLAST_LOG_WARN, "cannot re-attach to the running attempt (" + why + "): the job is restarted");
  }
  attempt_ = carried_figures_.attempts - 1;  // the earlier leaders' attempts counted on
  // Adopted, or started before by this executor: from the newest checkpoint.
  const Checkpoint from = find_checkpoint(checkpoint_dir_, -1);
  if (start_attempt(from, &why)) {
    waiting_to_lead_ = false;
    log(BALLAST_LOG_INFO,
        "this controller leads: the job is started" + (from.path.empty() ? std::string() : " from " + from.path));
    return;
  }
  if (backend_->fenced_off() || channel_busy_) return;
  waiting_to_lead_ = false;
  end_job(State::escalated, "the job did not start: " + why);
}

// A new term: what the earlier leaders' records say of this job, taken
// over (Backend::take_over). Slots are renamed and given the roles the
// adopted job had; a node drained by an earlier leader for node.silent is
// back once its agent connects to this controller.
bool Executor::take_over(std::string* error) {
  TakeOver t;
  if (!backend_->take_over(leader_log_, &t, error)) return false;
  taken_over_ = terms_seen_;
  for (size_t s = 0; s < slots_.size(); ++s) slots_[s].name = backend_->slot_name(int(s));
  if (t.outcome == TakeOver::ended) {
    waiting_to_lead_ = false;
    end_job(State::stopped, t.detail);
    return true;
  }
  if (t.outcome == TakeOver::adopted) {
    for (auto& s : slots_) s = SlotState{s.name, SlotState::standby, 0, 0, ""};
    for (size_t n = 0; n < t.active.size() && n < node_slot_.size(); ++n) {
      node_slot_[n] = t.active[n];
      slots_[size_t(t.active[n])].role = SlotState::active;
    }
    for (const auto& [slot, silent] : t.drained) {
      auto& s = slots_[size_t(slot)];
      s.role = SlotState::evicted;
      s.evicted_ns = now();
      s.replaced_by = "an earlier leader's replace";
      s.back_on_connect = silent;
      s.back = silent && connected_.count(s.name) > 0;
    }
    log(BALLAST_LOG_INFO, "took over the job an earlier leader ran: " + t.detail);
    carry_report(t.report);
    adopted_attempt_ = t.attempt;
    if (!t.restart.empty()) log(BALLAST_LOG_INFO, "the adopted job is restarted from its checkpoint: " + t.restart);
  }
  write_topology();
  return true;
}

// The earlier leaders' report figures (their newest snapshot's), this
// report's start: their first start, attempts, first loss, incidents and
// kept seconds. Malformed or missing: this report covers this term only.
void Executor::carry_report(const nlohmann::json& report) {
  Handover h;
  Lineage kept;
  std::string why = "the earlier leader's snapshot has no report";
  if (report.is_null() || !handover_from_json(report, &h, &kept, &why)) {
    log(BALLAST_LOG_WARN,
        "the job's report is not carried over (" + why + "): it covers this controller's term only, from its start");
    return;
  }
  // Carried again at a later term while this one waits to lead: replaced.
  incidents_.erase(incidents_.begin(), incidents_.begin() + std::ptrdiff_t(carried_incidents_));
  for (auto& i : h.incidents)
    if (i.outcome == "open") i.outcome = "handed over";
  incidents_.insert(incidents_.begin(), h.incidents.begin(), h.incidents.end());
  carried_incidents_ = h.incidents.size();
  for (size_t i = 0; i < incidents_.size(); ++i) incidents_[i].id = int(i) + 1;
  incidents_omitted_ = h.incidents_omitted;
  first_start_ns_ = h.start_ns;
  kept_ = std::move(kept);
  carried_figures_ = std::move(h);
  carried_figures_.incidents.clear();  // in incidents_ now
  carried_ = true;
  log(BALLAST_LOG_INFO, "carried over the job's report: " + std::to_string(carried_figures_.attempts) +
                            " attempt(s), " + std::to_string(carried_incidents_) + " incident(s), " +
                            std::to_string(kept_.seconds()) + " s in kept steps to step " +
                            std::to_string(kept_.last_step()));
}

// The job channel: its socket bound (replacing a socket no process
// answers at) and the control file made anew, or kept for ranks that read
// it on (re-attached: they are at its end).
bool Executor::open_channel(std::string* error, bool keep_commands) {
  channel_busy_ = ReportSocket::answers(socket_path_);
  if (channel_busy_) {
    *error = "another executor's job channel answers at " + socket_path_;
    return false;
  }
  channel_open_ = socket_.open(socket_path_, error) && control_.open(job_dir_ + "/control.jsonl", keep_commands, error);
  commands_kept_ = channel_open_ && keep_commands;
  return channel_open_;
}

// The attempt an earlier leader launched, still running as its records say
// (TakeOver::attempt): carried on in the state "running". What the ranks
// said to that leader is not known here; their next reports are (a rank's
// steps from its first report on, each once), and the detectors start again
// from this controller's events.
bool Executor::reattach(const nlohmann::json& a, std::string* error) {
  for (const char* key : {"number", "wall_ns", "master_port", "from_step"})
    if (!a.contains(key) || !a[key].is_number_integer()) {
      *error = std::string("the records' attempt has no '") + key + "' (a number): " + a.dump().substr(0, 200);
      return false;
    }
  const int64_t number = a["number"].get<int64_t>(), port = a["master_port"].get<int64_t>();
  if (number < 0 || number > INT32_MAX || port < 0 || port > 65535) {
    *error = "the records' attempt number " + std::to_string(number) + " or MASTER_PORT " + std::to_string(port) +
             " is out of range";
    return false;
  }
  std::map<int, int> rank_slots;
  for (int r = 0; r < cfg_.ranks; ++r) rank_slots[r] = node_slot_[size_t(r / cfg_.ranks_per_node)];
  if (!channel_open_ && !open_channel(error, true)) return false;
  attempt_ = int(number);  // before the backend's snapshot of it
  if (!backend_->reattach(rank_slots, error)) return false;
  commands_kept_ = false;  // the ranks read on where they are
  master_port_ = int(port);
  resume_step_ = a["from_step"].get<int64_t>();
  attempt_start_wall_ns_ = a["wall_ns"].get<int64_t>();
  attempt_start_ns_ = now();  // the ranks' grace for their first report here
  failed_ns_ = 0;
  for (auto& r : ranks_) {
    r = RankState{};
    r.hello = r.running = true;
  }
  spans_.push_back({"job", "re-attach " + std::to_string(attempt_), attempt_start_ns_, attempt_start_ns_, a});
  set_state(State::running, "re-attached to attempt " + std::to_string(attempt_) + " of an earlier leader");
  return true;
}

// The placement plugin picks standbys on this topology: one switch.
void Executor::write_topology() {
  std::string names;
  for (const auto& s : slots_) names += (names.empty() ? "" : ",") + s.name;
  std::ofstream topo(job_dir_ + "/topology.conf");
  topo << "# the job's slots (ballast run, " << backend_->name() << " backend)\nSwitchName=job Nodes=" << names << "\n";
}

// Refused by the fence after the job was started: another controller leads
// and the job is its own. Nothing more is done to it from here (what this
// executor would still ask, stopping the ranks and cancelling the job, is
// refused too).
void Executor::stand_down() {
  if (current_) finish("fenced", "this controller no longer leads");
  queue_.clear();
  end_job(State::stopped, "this controller no longer leads: the job is left to the one that does");
}

void Executor::stop() {
  if (thread_.joinable()) {
    quit_ = true;
    wake();
    thread_.join();
  }
  if (!summarised_ && attempt_ >= 0) {
    if (!ended_) end_job(State::interrupted, "ballast run was stopped (SIGINT/SIGTERM)");
    for (int s = 0; s < int(slots_.size()); ++s) backend_->stop_helpers(s);
    backend_->release();
    socket_.close();
    final_ = summary();
    summarised_ = true;
    const nlohmann::json j = summary_json(final_);
    publish_json("job.report", j);
    if (cfg_.report == "text") {
      const std::string text = summary_text(final_);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
    if (!cfg_.timeline.empty()) {
      std::ofstream out(cfg_.timeline);
      out << timeline_json(final_).dump() << "\n";
      if (!out) log(BALLAST_LOG_ERROR, "cannot write the timeline " + cfg_.timeline);
    }
    std::error_code ec;
    if (made_trace_dir_) fs::remove_all(trace_dir_, ec);
  }
}

bool Executor::prepare_trace_dir(std::string* error) {
  trace_dir_ = cfg_.trace_dir;
  if (trace_dir_.empty()) {
    const char* env = std::getenv("BALLAST_TRACE_DIR");
    if (env && *env) trace_dir_ = env;
  }
  if (trace_dir_.empty()) {
    // tmpfs: on a disk file system, write-back would fault the ranks' ring stores.
    char shm[] = "/dev/shm/ballast-traces-XXXXXX";
    char tmp[] = "/tmp/ballast-traces-XXXXXX";
    if (mkdtemp(shm))
      trace_dir_ = shm;
    else if (mkdtemp(tmp))
      trace_dir_ = tmp;
    else {
      *error = std::string("cannot make a trace folder in /dev/shm or /tmp: ") + std::strerror(errno);
      return false;
    }
    made_trace_dir_ = true;
  }
  return true;
}

// ---- inbox ---------------------------------------------------------------

// Into the loop's inbox; a message the loop must see at once also wakes it
// (the others wait for its next turn).
void Executor::post(Message m, bool wake_loop) {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    inbox_.push_back(std::move(m));
  }
  if (wake_loop) wake();
}

void Executor::wake() {
  char c = 0;
  ssize_t n = write(wake_[1], &c, 1);
  (void)n;
}

void Executor::post_action(const ballast_recovery_action& a, int64_t ts_ns) {
  Message m;
  m.kind = Message::action;
  m.act.name = json_or_empty(a.action);
  m.act.subject = json_or_empty(a.subject);
  m.act.reason = json_or_empty(a.reason);
  m.act.args = json_or_empty(a.args);
  m.act.policy = json_or_empty(a.policy);
  m.act.cause = json_or_empty(a.cause_topic);
  m.act.received_ns = ts_ns ? ts_ns : wall_ns();
  post(std::move(m), true);
}

void Executor::post_fault(const std::string& topic, const ballast_fault_report& f, int64_t ts_ns) {
  Message m;
  m.kind = Message::fault;
  m.topic = topic;
  m.subject = json_or_empty(f.subject);
  m.fault_kind = json_or_empty(f.kind);
  m.detector = json_or_empty(f.detector);
  m.rank = f.rank;
  m.since_ns = f.since_ns;
  m.detected_ns = f.detected_ns ? f.detected_ns : (ts_ns ? ts_ns : wall_ns());
  m.evidence = json_or_empty(f.evidence);
  post(std::move(m), true);
}

void Executor::post_straggler(const ballast_straggler_report& r, int64_t ts_ns) {
  // Only a report that names a slow worker is a detection (of a slowed rank
  // or node): a job-wide or a random slowdown names no fault.
  if (!r.kind || std::strcmp(r.kind, "worker") != 0 || !r.culprits) return;
  const ballast_straggler_culprit* worst = nullptr;
  for (uint32_t i = 0; i < r.count && !worst; ++i)
    if (r.culprits[i].dimension && r.culprits[i].name && std::strcmp(r.culprits[i].dimension, "rank") == 0)
      worst = &r.culprits[i];
  if (!worst) return;
  Message m;
  m.kind = Message::fault;
  m.topic = "straggler.report";
  m.subject = std::string("rank:") + worst->name;
  m.rank = std::atoi(worst->name);
  m.fault_kind = "straggler";
  m.detector = "straggler";
  m.detected_ns = ts_ns ? ts_ns : wall_ns();
  m.evidence = nlohmann::json{{"slowdown", r.slowdown},
                              {"rank_slowdown", worst->slowdown},
                              {"first_step", r.first_step},
                              {"last_step", r.last_step}}
                   .dump();
  post(std::move(m), false);
}

void Executor::post_plan(const ballast_placement_plan& p) {
  Message m;
  m.kind = Message::plan;
  m.plan_job = json_or_empty(p.job);
  for (uint32_t i = 0; i < p.count; ++i) m.plan_nodes.push_back(json_or_empty(p.nodes[i].name));
  post(std::move(m), false);
}

void Executor::post_back(const std::string& node) {
  Message m;
  m.kind = Message::back;
  m.subject = node;
  post(std::move(m), true);
}

void Executor::post_leader(const std::string& json) {
  Message m;
  m.kind = Message::leader;
  m.text = json;
  post(std::move(m), false);
}

void Executor::post_connected(const std::string& node) {
  Message m;
  m.kind = Message::connected;
  m.subject = node;
  post(std::move(m), true);
}

void Executor::post_relayed(const std::string& json) {
  Message m;
  m.kind = Message::relayed;
  m.text = json;
  post(std::move(m), true);
}

void Executor::post_placement_error(const std::string& message) {
  Message m;
  m.kind = Message::plan_error;
  m.text = message;
  post(std::move(m), false);
}

// ---- the supervising loop -------------------------------------------------

void Executor::loop() {
  while (!quit_) {
    pollfd fds[2] = {{socket_.fd(), POLLIN, 0}, {wake_[0], POLLIN, 0}};
    poll(fds, 2, 20);
    if (fds[1].revents & POLLIN) {
      char buf[256];
      while (read(wake_[0], buf, sizeof buf) > 0) {
      }
    }
    if (quit_) break;
    for (const auto& d : socket_.drain()) {
      // Not this controller's job yet (the ranks of a leader that died): not
      // applied, as relayed reports are not; it re-attaches or restarts them.
      if (waiting_to_lead_) continue;
      std::string why;
      if (auto r = parse_report(d, cfg_.ranks, &why)) {
        host_->counter_add(host_, "reports_direct", 1);
        handle_report(*r);
      } else {
        host_->counter_add(host_, "bad_reports", 1);
        log(BALLAST_LOG_WARN, "job channel: a report was dropped: " + why);
      }
    }
    for (const auto& e : backend_->reap()) handle_exit(e);
    stop_lingering_ranks();
    std::deque<Message> msgs;
    {
      std::lock_guard<std::mutex> lock(inbox_mu_);
      msgs.swap(inbox_);
    }
    // While waiting to lead the job is not this controller's: what comes is
    // not acted on, but for the terms and the agents that connect, and the
    // relayed reports, kept for when it leads.
    if (waiting_to_lead_) {
      for (auto& m : msgs)
        if (m.kind == Message::leader || m.kind == Message::connected)
          handle_term(m);
        else if (m.kind == Message::relayed)
          hold_relayed(std::move(m));
      try_to_lead();
      if (waiting_to_lead_) continue;
      msgs = take_held_relayed();
    }
    for (auto& m : msgs) handle_message(m);
    if (!ended_ && backend_->fenced_off()) stand_down();
    if (ended_) continue;
    fire_injections();
    advance();
    if (!ended_ && backend_->fenced_off()) stand_down();
    if (!ended_ && state_ == State::running && !current_) backend_->refresh();
    sample_metrics();
    show_progress(false);
  }
  if (tty_ && cfg_.progress) std::fputs("\r\033[K", stderr);
}

void Executor::show_progress(bool force) {
  if (!tty_ || !cfg_.progress) return;
  const int64_t t = now();
  if (!force && t < next_progress_ns_) return;
  next_progress_ns_ = t + 250000000;
  int hello = 0;
  for (const auto& r : ranks_) hello += r.hello;
  char line[256];
  const std::string total = cfg_.steps > 0 ? "/" + std::to_string(cfg_.steps) : "";
  const double loss = loss_.empty() ? NAN : loss_.rbegin()->second;
  std::snprintf(line, sizeof line, "\r\033[K[ballast] %6.1f s  %s  step %lld%s  loss %.4f  start %d%s%s",
                double(t - first_start_ns_) / 1e9, state_name(state_), static_cast<long long>(high_water_),
                total.c_str(), loss, attempt_ + 1,
                state_ == State::starting || (current_ && current_->wait == InFlight::hello)
                    ? ("  ranks up " + std::to_string(hello) + "/" + std::to_string(cfg_.ranks)).c_str()
                    : "",
                current_ ? ("  action " + current_->action.name).c_str() : "");
  std::fputs(line, stderr);
}

void Executor::set_state(State s, const std::string& reason) {
  if (s == state_ && state_published_) return;
  state_published_ = true;
  for (auto& sp : spans_)
    if (sp.track == "job" && sp.end_ns == 0) sp.end_ns = now();
  state_ = s;
  spans_.push_back({"job", state_name(s), now(), 0, {{"attempt", attempt_}, {"reason", reason}}});
  publish_json("job.state", {{"job", cfg_.name},
                             {"state", state_name(s)},
                             {"attempt", attempt_},
                             {"step", high_water_},
                             {"reason", reason},
                             {"terminal", s == State::finished || s == State::escalated || s == State::stopped ||
                                              s == State::interrupted}});
}

void Executor::end_job(State s, const std::string& reason) {
  if (ended_) return;
  stop_ranks();
  end_reason_ = reason;
  if (current_) finish(s == State::finished ? "ok" : "cancelled", "the job ended: " + reason);
  for (auto& i : incidents_)
    if (i.outcome == "open") i.outcome = s == State::escalated ? "escalated" : state_name(s);
  ended_ = true;
  set_state(s, reason);
  log(s == State::finished ? BALLAST_LOG_INFO : BALLAST_LOG_ERROR, std::string("job ") + state_name(s) + ": " + reason);
}

// ---- ranks ----------------------------------------------------------------

std::string Executor::pending_trainer_injections() const {
  std::string out;
  for (size_t i = 0; i < cfg_.injections.size(); ++i) {
    const auto& in = cfg_.injections[i];
    if (fired_[i] || (in.kind != FaultKind::nan && in.kind != FaultKind::usererror)) continue;
    out += (out.empty() ? "" : ",") + in.spec;
  }
  return out;
}

bool Executor::start_attempt(const Checkpoint& from, std::string* error) {
  ++attempt_;
  master_port_ = launch::free_port();
  if (master_port_ == 0) {
    *error = "found no free port for MASTER_PORT outside ip_local_port_range";
    return false;
  }
  // Every attempt gets its own secret, so a rank left over from an earlier
  // attempt cannot join the new one's bootstrap.
  const std::string secret = launch::bootstrap_secret();
  if (secret.empty()) {
    *error = std::string("cannot make a bootstrap secret: ") + std::strerror(errno);
    return false;
  }
  // Open before the ranks' environment names the control file. Kept for
  // running ranks this executor might have re-attached to: new ranks read
  // it from its start.
  if (!channel_open_ && !open_channel(error, false)) return false;
  if (commands_kept_ && !control_.open(control_.path(), false, error)) return false;
  commands_kept_ = false;
  for (auto& r : ranks_) r = RankState{};
  failed_ns_ = 0;
  resume_step_ = from.step;
  // The steps after the checkpoint are trained again: the old ones are lost.
  if (!kept_.rewind(from.step))
    log(BALLAST_LOG_WARN, "the seconds of the steps up to " + from.path +
                              " (an earlier leader's) are not known here: the report counts them as lost");
  loss_.erase(loss_.upper_bound(from.step), loss_.end());
  if (from.step <= 0) carried_figures_.have_loss = false;  // from the seed: the earlier losses are gone
  attempt_start_ns_ = now();
  attempt_start_wall_ns_ = wall_ns();
  const std::string inject = pending_trainer_injections();
  const int rpn = cfg_.ranks_per_node;
  for (int n = 0; n < cfg_.nodes(); ++n) {
    std::vector<RankLaunch> launches;
    for (int l = 0; l < rpn; ++l) {
      const int rank = n * rpn + l;
      RankLaunch rl;
      rl.rank = rank;
      rl.argv = cfg_.command;
      rl.env = launch::torchrun_env({rank, cfg_.ranks, l, rpn, n}, master_port_);
      rl.env.emplace_back("BALLAST_BOOTSTRAP_SECRET", secret);
      // The slot's network (MASTER_ADDR, transports), then the job's own
      // environment: each replaces what came before it.
      for (const auto& [k, v] : backend_->slot_env(node_slot_[size_t(n)], node_slot_[0])) set_env(&rl.env, k, v);
      for (const auto& [k, v] : cfg_.env) set_env(&rl.env, k, v);
      rl.env.emplace_back("BALLAST_TRACE_DIR", trace_dir_);
      rl.env.emplace_back("BALLAST_JOB_DIR", job_dir_);
      rl.env.emplace_back("BALLAST_CHECKPOINT_DIR", checkpoint_dir_);
      rl.env.emplace_back("BALLAST_RESUME_FROM", from.path);
      rl.env.emplace_back("BALLAST_JOB_SOCKET", job_socket(n));
      rl.env.emplace_back("BALLAST_CONTROL_FILE", control_.path());
      rl.env.emplace_back("BALLAST_ATTEMPT", std::to_string(attempt_));
      rl.env.emplace_back("BALLAST_INJECT", inject);
      rl.env.emplace_back("BALLAST_NODE", slots_[size_t(node_slot_[size_t(n)])].name);
      rl.log_path = job_dir_ + "/logs/rank-" + std::to_string(rank) + ".log";
      launches.push_back(std::move(rl));
    }
    if (!backend_->start(node_slot_[size_t(n)], launches, error)) {
      stop_ranks();
      return false;
    }
    for (int l = 0; l < rpn; ++l) ranks_[size_t(n * rpn + l)].running = true;
  }
  backend_->set_attempt({{"number", attempt_},
                         {"wall_ns", attempt_start_wall_ns_},
                         {"master_port", master_port_},
                         {"from_step", from.step},
                         {"checkpoint", from.path}});
  if (!backend_->launch(error)) {
    stop_ranks();
    return false;
  }
  spans_.push_back({"job",
                    "start " + std::to_string(attempt_),
                    attempt_start_ns_,
                    attempt_start_ns_,
                    {{"checkpoint", from.path}, {"step", from.step}, {"port", master_port_}}});
  set_state(attempt_ == 0 ? State::starting : State::recovering,
            from.path.empty() ? "from the seed" : "from " + from.path);
  return true;
}

void Executor::stop_ranks() {
  backend_->stop_all(cfg_.stop_grace_s);
  for (auto& r : ranks_) r.running = false;
  socket_.drain();  // what the stopped processes said last is of the old attempt
}

// ---- reports and exits ---------------------------------------------------

void Executor::handle_report(const Report& r) {
  RankState& rs = ranks_[size_t(r.rank)];
  if (r.type == "hello") {
    rs.hello = true;
    bool all = true;
    for (const auto& x : ranks_) all = all && x.hello;
    if (all && state_ == State::starting) set_state(State::running, "every rank is up");
  } else if (r.type == "step") {
    rs.last_step = r.step;
    if (r.step > high_water_) high_water_ = r.step;
    publish_step(r);
    const double end = r.start_s + r.duration_s;
    const double prev_end = rs.last_end_s;
    rs.last_end_s = end;
    if (r.rank == 0) {
      kept_.add(r.step, prev_end > 0 && end > prev_end ? end - prev_end : r.duration_s);
      loss_[r.step] = r.loss;
      spans_.push_back(
          {"steps",
           "step " + std::to_string(r.step),
           int64_t(r.start_s * 1e9),
           int64_t(end * 1e9),
           {{"loss", std::isfinite(r.loss) ? nlohmann::json(r.loss) : nlohmann::json()}, {"attempt", attempt_}}});
      if (tty_ == false && cfg_.steps == 0 && r.step % 100 == 0)
        log(BALLAST_LOG_INFO, "step " + std::to_string(r.step) + ", loss " + std::to_string(r.loss));
    }
    // Training resumed: the incidents waiting for it are recovered.
    if (r.step > resume_step_)
      for (auto& i : incidents_)
        if (i.outcome == "open" && i.resumed_from >= 0 && i.resumed_ns == 0 && attempt_start_ns_ >= i.decided_ns &&
            i.decided_ns != 0) {
          i.resumed_ns = int64_t(r.start_s * 1e9);
          if (i.resumed_ns < attempt_start_ns_) i.resumed_ns = now();
          i.outcome = "recovered";
          log(BALLAST_LOG_INFO, "incident " + std::to_string(i.id) + " (" + i.fault + "): training resumed at step " +
                                    std::to_string(r.step));
        }
    if (state_ == State::recovering && !current_) set_state(State::running, "training resumed");
  } else if (r.type == "checkpoint") {
    kept_.checkpoint(r.step);
    spans_.push_back({"steps",
                      "checkpoint " + std::to_string(r.step),
                      int64_t((wall_ns()) - r.seconds * 1e9),
                      wall_ns(),
                      {{"path", r.path}, {"bytes", r.bytes}}});
    if (current_ && current_->wait == InFlight::checkpoint && r.step >= current_->min_step)
      finish("ok", "saved " + r.path);
    // Old checkpoints go only while training runs undisturbed: a recovery
    // in flight may still need any of them.
    if (state_ == State::running && !current_)
      for (const auto& c : prune_checkpoints(checkpoint_dir_, cfg_.keep_checkpoints, nan_step_))
        log(BALLAST_LOG_DEBUG, "deleted the old checkpoint " + c.path);
  } else if (r.type == "error") {
    rs.error_kind = r.kind;
    rs.error_message = r.message;
    rs.error_step = r.step;
  } else if (r.type == "done") {
    rs.done = true;
    rs.done_ns = now();
  }
}

void Executor::publish_fault(int rank, const std::string& kind, const std::string& evidence) {
  const int64_t t = now();
  const std::string subject = "rank:" + std::to_string(rank);
  ballast_fault_report f{};
  f.size = sizeof f;
  f.stage = BALLAST_FAULT_CONFIRMED;
  f.subject = subject.c_str();
  f.rank = rank;
  f.kind = kind.c_str();
  f.metric = "process.exit";
  f.confidence = 1.0;
  f.since_ns = t;
  f.detected_ns = t;
  f.evidence = evidence.c_str();
  f.detector = "executor";
  ballast_event e{};
  e.size = sizeof e;
  e.schema = BALLAST_SCHEMA_FAULT_REPORT;
  e.topic = "fault.confirmed";
  e.source.rank = rank;
  e.payload = &f;
  e.payload_size = sizeof f;
  host_->publish(host_, &e);
}

// A rank that reported done but does not exit hangs in its teardown (a
// process group's destructor joining threads that wait for the
// interpreter's lock, NCCL's communicator destroy): training is over, so it
// is killed and counted as finished rather than holding the job forever.
void Executor::stop_lingering_ranks() {
  const int64_t t = now();
  for (size_t r = 0; r < ranks_.size(); ++r) {
    RankState& rs = ranks_[r];
    if (!rs.done || !rs.running || rs.killed_after_done || t - rs.done_ns < int64_t(cfg_.exit_grace_s * 1e9)) continue;
    char text[160];
    std::snprintf(text, sizeof text,
                  "rank %zu reported done %.0f s ago but has not exited: killed (a hang in its teardown)", r,
                  double(t - rs.done_ns) / 1e9);
    log(BALLAST_LOG_WARN, text);
    rs.killed_after_done = true;
    host_->counter_add(host_, "ranks_killed_after_done", 1);
    backend_->signal(int(r), SIGKILL);
  }
}

void Executor::handle_exit(const RankExit& e) {
  RankState& rs = ranks_[size_t(e.rank)];
  rs.running = false;
  const bool clean = (WIFEXITED(e.status) && WEXITSTATUS(e.status) == 0) || rs.killed_after_done;
  if (clean) {
    bool all = true;
    for (const auto& r : ranks_) all = all && !r.running;
    if (all && failed_ns_ == 0)
      end_job(State::finished, "every rank finished (step " + std::to_string(high_water_) + ")");
    return;
  }
  const std::string how = WIFEXITED(e.status)
                              ? "exited with code " + std::to_string(WEXITSTATUS(e.status))
                              : std::string("was killed by signal ") + std::to_string(WTERMSIG(e.status)) + " (" +
                                    strsignal(WTERMSIG(e.status)) + ")";
  if (failed_ns_ != 0) {
    log(BALLAST_LOG_INFO, "rank " + std::to_string(e.rank) + " " + how + " (after the job's first failure)");
    return;
  }
  failed_ns_ = now();
  std::string kind = "crashed";
  nlohmann::json ev = {{"pid", e.pid}, {"how", how}, {"attempt", attempt_}, {"step", rs.last_step}};
  if (rs.error_kind == "user")
    kind = "user_error";
  else if (rs.error_kind == "nan")
    kind = "nan";
  if (!rs.error_kind.empty()) {
    ev["message"] = rs.error_message;
    ev["error_kind"] = rs.error_kind;
    ev["step"] = rs.error_step;
  }
  // The trainer injected it itself: the incident opens now, at the step
  // that was asked for.
  for (size_t i = 0; i < cfg_.injections.size(); ++i) {
    const auto& in = cfg_.injections[i];
    if (fired_[i] ||
        !((in.kind == FaultKind::nan && kind == "nan") || (in.kind == FaultKind::usererror && kind == "user_error")))
      continue;
    fired_[i] = true;
    const int64_t at = rs.last_end_s > 0 ? int64_t(rs.last_end_s * 1e9) : attempt_start_ns_;
    open_incident(in.spec, in.origin, at);
    break;
  }
  if (kind == "nan") nan_step_ = rs.error_step >= 0 ? rs.error_step : rs.last_step + 1;
  log(BALLAST_LOG_WARN, "rank " + std::to_string(e.rank) + " " + how +
                            (rs.error_message.empty() ? "" : ": " + rs.error_kind + " error: " + rs.error_message));
  publish_fault(e.rank, kind, ev.dump());
}

// ---- bus messages -----------------------------------------------------------

int Executor::open_incident(const std::string& fault, const std::string& origin, int64_t injected_ns) {
  Incident i;
  i.id = int(incidents_.size()) + 1;
  i.fault = fault;
  i.origin = origin;
  i.injected_ns = injected_ns;
  i.step_at_fault = high_water_;
  incidents_.push_back(i);
  if (injected_ns) spans_.push_back({"faults", "injected " + fault, injected_ns, injected_ns, {{"origin", origin}}});
  return i.id;
}

int Executor::current_incident() const {
  for (auto it = incidents_.rbegin(); it != incidents_.rend(); ++it)
    if (it->outcome == "open" && it->detected_ns != 0) return it->id;
  return -1;
}

void Executor::on_fault(const Message& m) {
  // A report about processes of an earlier start (the hang detector still
  // sees the rings of ranks the last restart killed) is not a new fault.
  // A node the executor took out of the job falls silent on purpose.
  if (m.topic == "node.silent") {
    const int slot = slot_of_subject(m.subject);
    silent_outside_ = slot >= 0 && slots_[size_t(slot)].role != SlotState::active;
    if (silent_outside_) return;
  }
  const int64_t since = m.since_ns > 0 ? m.since_ns : m.detected_ns;
  const bool fresh = since >= last_restart_ns_ || m.detector == "executor";
  if (!fresh) return;
  // The executor reaps every rank, so it is the authority on their exits:
  // another detector's `crashed` about a rank is that exit (which the
  // executor reports itself) or the ring of a process of an attempt that is
  // already over (the hang detector reads a rank's old ring until its new
  // process writes one). Neither is a new fault.
  if (m.detector != "executor" && m.fault_kind == "crashed" && m.rank >= 0 && m.rank < cfg_.ranks) {
    log(BALLAST_LOG_INFO, m.detector + " reports " + m.subject + " crashed: the executor reports its ranks' exits " +
                              "itself; not a new fault");
    return;
  }
  // A node silent since after the last restart is a new fault too (a second
  // node lost after a first one's replace).
  if (m.topic == "node.silent") last_fresh_fault_ns_ = std::max(last_fresh_fault_ns_, m.detected_ns);
  if (m.topic == "fault.confirmed") {
    last_fresh_fault_ns_ = std::max(last_fresh_fault_ns_, m.detected_ns);
    // The kind alone: which rank of a job that fails the same way each time
    // is reaped first is a race.
    last_fault_signature_ = m.fault_kind;
  }
  Incident* target = nullptr;
  for (auto& i : incidents_)
    if (i.outcome == "open" && i.detected_ns == 0) {
      target = &i;
      break;
    }
  if (!target) {
    if (m.topic != "fault.confirmed") return;
    for (const auto& i : incidents_)
      if (i.outcome == "open" && i.detected_ns != 0) return;  // one more report of the open incident
    target = &incidents_[size_t(open_incident(m.fault_kind + " " + m.subject, "not injected", 0) - 1)];
  }
  target->detected_ns = m.detected_ns;
  target->detector = m.detector;
  target->verdict = m.fault_kind + " " + m.subject;
  // The job's own account of it (a user error, a NaN, a collective a rank
  // left out), for the report.
  if (nlohmann::json ev = nlohmann::json::parse(m.evidence, nullptr, false);
      ev.is_object() && ev.contains("message") && ev["message"].is_string())
    target->message = ev["message"];
  spans_.push_back({"faults", "detected " + target->verdict, m.detected_ns, m.detected_ns, {{"detector", m.detector}}});
  log(BALLAST_LOG_INFO, "incident " + std::to_string(target->id) + " (" + target->fault + "): " + m.topic + " " +
                            target->verdict + " by " + m.detector);
}

void Executor::handle_message(Message& m) {
  if (m.kind == Message::relayed) {
    handle_relayed(m);
    return;
  }
  if (m.kind == Message::fault) {
    on_fault(m);
    return;
  }
  if (m.kind == Message::plan) {
    if (m.plan_job == cfg_.name + "-placement") {
      pending_plan_ = m.plan_nodes;
      plan_answered_ = true;
    }
    return;
  }
  if (m.kind == Message::plan_error) {
    placement_error_ = m.text;
    plan_answered_ = true;
    return;
  }
  if (m.kind == Message::leader || m.kind == Message::connected) return handle_term(m);
  if (m.kind == Message::back) {
    for (auto& s : slots_)
      if (s.name == m.subject && s.role == SlotState::evicted && backend_->repaired_when_back()) {
        s.back = true;
        log(BALLAST_LOG_INFO, "node.back " + s.name + ": evicted, to be a standby again");
      }
    return;
  }
  Action a = std::move(m.act);
  a.id = next_action_id_++;
  if (!known_action(a.name)) {
    log(BALLAST_LOG_ERROR, "recovery.action '" + a.name + "' is not an action the executor knows; ignored");
    InFlight f;
    f.action = a;
    f.start_ns = now();
    journal("end", f, "refused", "unknown action");
    return;
  }
  if (ended_) return;
  if (int inc = current_incident(); inc > 0) {
    Incident& i = incidents_[size_t(inc - 1)];
    if (i.decided_ns == 0) i.decided_ns = a.received_ns;
  }
  if (a.cause == "node.silent" && silent_outside_) {
    InFlight f;
    f.action = a;
    f.start_ns = now();
    journal("end", f, "superseded", "the silent node is no longer in the job (evicted or standby)");
    return;
  }
  // A restart for a fault the last restart already dealt with: every
  // detector reports a crash in its own time, the job needs one restart.
  const bool fault_caused = a.cause.rfind("fault.", 0) == 0 || a.cause.rfind("node.", 0) == 0;
  if (restarts_job(a.name) && fault_caused && last_restart_ns_ != 0 && last_fresh_fault_ns_ < last_restart_ns_ &&
      a.name != "replace") {
    if (a.name == "evict") superseded_evict_ = a.subject;
    InFlight f;
    f.action = a;
    f.start_ns = now();
    journal(
        "end", f, "superseded",
        "no new fault since the restart at " + std::to_string(double(last_restart_ns_ - first_start_ns_) / 1e9) + " s");
    return;
  }
  // The replace the policy pairs with an evict goes with it. (A replace is
  // exempt from the rule above: the evict before it restarts the job.)
  if (a.name == "evict") superseded_evict_.clear();
  if (a.name == "replace" && fault_caused && !superseded_evict_.empty() && a.subject == superseded_evict_) {
    superseded_evict_.clear();
    InFlight f;
    f.action = a;
    f.start_ns = now();
    journal("end", f, "superseded", "the evict of " + a.subject + " it goes with was superseded");
    return;
  }
  uint64_t into = 0;
  if (!queue_.push(a, &into)) {
    InFlight f;
    f.action = a;
    f.start_ns = now();
    journal("end", f, "merged", "into queued action " + std::to_string(into));
    return;
  }
  log(BALLAST_LOG_INFO, "action " + std::to_string(a.id) + " queued: " + a.name +
                            (a.subject.empty() ? "" : " " + a.subject) + " (" + a.reason + ")");
}

// ---- injections -------------------------------------------------------------

void Executor::fire_injections() {
  if (state_ != State::running && state_ != State::starting) return;
  const double t = double(now() - first_start_ns_) / 1e9;
  for (size_t i = 0; i < cfg_.injections.size(); ++i) {
    const auto& in = cfg_.injections[i];
    if (fired_[i] || in.kind == FaultKind::nan || in.kind == FaultKind::usererror) continue;
    if (in.at_s >= 0 ? t < in.at_s : high_water_ < in.at_step) continue;
    if (in.kind != FaultKind::machine && !backend_->running(in.rank)) continue;  // fires once the rank runs
    fired_[i] = true;
    std::string error;
    bool ok = true;
    switch (in.kind) {
      case FaultKind::hang:
        ok = backend_->signal(in.rank, SIGSTOP);
        break;
      case FaultKind::crash:
        ok = backend_->signal(in.rank, SIGKILL);
        break;
      case FaultKind::skip:
        ok = control_.send("skip", in.rank, "", &error);
        break;
      case FaultKind::slow:
        ok = control_.send("slow", in.rank, nlohmann::json{{"factor", in.factor}}.dump(), &error);
        break;
      case FaultKind::machine: {
        const int slot = node_slot_[size_t(in.node)];
        if (in.machine_kind == "net")
          ok = backend_->degrade_network(slot, &error);
        else
          ok = backend_->spawn_helper(slot, in.machine_kind == "mem" ? mem_hog : cpu_hog) > 0;
        break;
      }
      case FaultKind::nan:
      case FaultKind::usererror:
        break;
    }
    if (!ok) {
      log(BALLAST_LOG_ERROR, "injection " + in.spec + " (" + in.origin + ") failed: " + error);
      continue;
    }
    // A slow rank or a skip is not a failure the executor sees: its
    // incident opens all the same, and a detector may close it.
    open_incident(in.spec, in.origin, now());
    publish_json("job.injected", {{"spec", in.spec}, {"origin", in.origin}, {"note", in.note}, {"at_s", t}});
    log(BALLAST_LOG_INFO, "injected " + in.spec + (in.note.empty() ? "" : " (" + in.note + ")"));
  }
}

// ---- actions --------------------------------------------------------------------

int Executor::slot_of_subject(const std::string& subject) const {
  if (subject.rfind("rank:", 0) == 0) {
    const int rank = std::atoi(subject.c_str() + 5);
    if (rank < 0 || rank >= cfg_.ranks) return -1;
    return node_slot_[size_t(rank / cfg_.ranks_per_node)];
  }
  for (size_t s = 0; s < slots_.size(); ++s)
    if (slots_[s].name == subject) return int(s);
  return -1;
}

// controller.leader: the log of the new term's predecessors, for
// take_over; node.connected: a node an earlier leader drained for its
// silence is back.
void Executor::handle_term(const Message& m) {
  if (m.kind == Message::leader) {
    const auto j = nlohmann::json::parse(m.text, nullptr, false);
    ++terms_seen_;
    connected_.clear();
    leader_log_ = nlohmann::json::array();
    if (j.is_object() && j.contains("log") && j["log"].is_array())
      leader_log_ = j["log"];
    else
      log(BALLAST_LOG_ERROR, "controller.leader without a log of the earlier leaders' records: nothing taken over");
    if (j.is_object() && j.value("log_complete", true) == false)
      log(BALLAST_LOG_WARN, "controller.leader: the action log was read in part (its newest records)");
    return;
  }
  connected_.insert(m.subject);
  for (auto& s : slots_)
    if (s.name == m.subject && s.role == SlotState::evicted && s.back_on_connect && !s.back) {
      s.back = true;
      log(BALLAST_LOG_INFO, "node.connected " + s.name + ": drained by an earlier leader, to be a standby again");
    }
}

// What the backend records against an evicted node (Slurm: the drain
// reason): the fault that caused it, as the policy named it.
std::string Executor::eviction_reason(const Action& a) const {
  std::string why = "ballast " + a.name + ": " + (a.reason.empty() ? a.subject : a.reason);
  if (!a.cause.empty() && a.cause != "executor") why += " [" + a.cause + "]";
  return why;
}

void Executor::journal(const std::string& event, const InFlight& f, const std::string& outcome,
                       const std::string& detail) {
  const int64_t t = now();
  nlohmann::json j = {{"event", event},
                      {"id", f.action.id},
                      {"action", f.action.name},
                      {"subject", f.action.subject},
                      {"reason", f.action.reason},
                      {"cause", f.action.cause},
                      {"policy", f.action.policy},
                      {"args", f.action.args},
                      {"try", f.action.tries + 1},
                      {"received_s", double(f.action.received_ns) / 1e9},
                      {"start_s", double(f.start_ns) / 1e9},
                      {"attempt", attempt_},
                      {"step", high_water_}};
  if (event == "end") {
    j["end_s"] = double(t) / 1e9;
    j["outcome"] = outcome;
    j["detail"] = detail;
  }
  std::ofstream out(job_dir_ + "/actions.jsonl", std::ios::app);
  out << j.dump() << "\n";
  publish_json("job.action", j);
  if (event == "end" && f.start_ns != 0 && outcome != "merged" && outcome != "superseded")
    spans_.push_back({"actions",
                      f.action.name + (f.action.subject.empty() ? "" : " " + f.action.subject),
                      f.start_ns,
                      std::max(t, f.start_ns + 1000),
                      {{"outcome", outcome}, {"detail", detail}}});
}

void Executor::begin(Action a) {
  InFlight f;
  f.action = std::move(a);
  f.start_ns = now();
  f.incident = current_incident();
  journal("start", f, "", "");
  const auto& act = f.action;
  nlohmann::json args = act.args.empty() ? nlohmann::json::object() : nlohmann::json::parse(act.args, nullptr, false);
  if (!args.is_object()) args = nlohmann::json::object();
  current_ = f;
  log(BALLAST_LOG_INFO, "action " + std::to_string(act.id) + ": " + act.name +
                            (act.subject.empty() ? "" : " " + act.subject) +
                            (act.tries ? " (try " + std::to_string(act.tries + 1) + ")" : "") + ": " + act.reason);
  if (f.incident > 0) incidents_[size_t(f.incident - 1)].actions.push_back(act.name);

  if (act.name == "escalate") {
    std::string msg = act.reason;
    if (f.incident > 0 && !incidents_[size_t(f.incident - 1)].message.empty())
      incidents_[size_t(f.incident - 1)].message = incidents_[size_t(f.incident - 1)].message;
    finish("ok", "the job is stopped for a person to look at");
    end_job(State::escalated, msg);
    return;
  }
  if (act.name == "checkpoint_now") {
    std::string error;
    if (!control_.send("checkpoint_now", -1, "", &error)) {
      finish("failed", error);
      return;
    }
    current_->wait = InFlight::checkpoint;
    current_->min_step = high_water_;
    current_->deadline_ns = now() + int64_t(cfg_.checkpoint_timeout_s * 1e9);
    return;
  }
  if (act.name == "pause") {
    double seconds = cfg_.pause_s;
    if (args.contains("seconds") && args["seconds"].is_number()) seconds = args["seconds"].get<double>();
    for (int r = 0; r < cfg_.ranks; ++r) backend_->signal(r, SIGSTOP);
    set_state(State::paused, act.reason);
    current_->wait = InFlight::pause_end;
    current_->deadline_ns = now() + int64_t(seconds * 1e9);
    return;
  }
  // What is left stops the ranks and starts them again.
  if (restarts_job(act.name) && act.name != "replace") {
    // The restart-loop rule: the same fault back after each restart.
    const std::string sig =
        fault_signature().empty() ? act.name + " " + act.subject + " " + act.reason : fault_signature();
    if (loop_rule_.note(sig, high_water_) > 0 && loop_rule_.looping()) {
      const std::string why = "restart loop: '" + sig + "' came back " + std::to_string(loop_rule_.count()) +
                              " times in a row without training getting past step " + std::to_string(high_water_);
      finish("refused", why);
      end_job(State::escalated, why);
      return;
    }
  }
  if (act.name == "evict") {
    const int slot = slot_of_subject(act.subject);
    if (slot < 0 || slots_[size_t(slot)].role != SlotState::active) {
      finish("failed", "'" + act.subject + "' is not a node or rank of the job");
      return;
    }
    if (std::string error; !backend_->evict(slot, eviction_reason(act), act.cause, &error)) {
      finish("failed", error);
      return;
    }
    set_state(State::recovering, "evicting " + slots_[size_t(slot)].name);
    stop_ranks();
    last_restart_ns_ = now();
    backend_->stop_helpers(slot);
    slots_[size_t(slot)].role = SlotState::evicted;
    slots_[size_t(slot)].evicted_ns = now();
    slots_[size_t(slot)].back = false;
    slots_[size_t(slot)].back_on_connect = false;
    slots_[size_t(slot)].replaced_by.clear();
    const std::string name = slots_[size_t(slot)].name;
    finish("ok", "took " + name + " out of the job");
    // An evicted node is replaced: do it now unless the policy asked for it next.
    const Action* next = queue_.front();
    if (!next || next->name != "replace") {
      Action r;
      r.id = next_action_id_++;
      r.name = "replace";
      r.subject = name;
      r.reason = "replacing the evicted " + name;
      r.cause = "executor";
      r.received_ns = now();
      queue_.push_front(r);
    } else if (slot_of_subject(next->subject) != slot) {
      log(BALLAST_LOG_WARN, "the replace after evicting " + name + " names " + next->subject + "; replacing " + name);
    }
    return;
  }
  if (act.name == "replace") {
    // Which node: the subject, or the one evicted last.
    const int failed = slot_of_subject(act.subject);
    // An evicted node a standby already took the place of (the evict's
    // implied replace ran before the policy's; it may be a standby again by
    // now, repaired) needs nothing more while the job runs. When that
    // replace's start failed, a try again restarts the job as it is placed.
    const bool placed =
        failed >= 0 && slots_[size_t(failed)].role != SlotState::active && !slots_[size_t(failed)].replaced_by.empty();
    const std::string taken =
        placed ? slots_[size_t(failed)].replaced_by + " already took the place of " + slots_[size_t(failed)].name : "";
    if (placed && state_ == State::running) {
      finish("superseded", taken);
      return;
    }
    if (!placed) {
      begin_replace(failed, act);
      return;
    }
    current_->detail = taken;
  }
  // restart, rollback
  Checkpoint from;
  if (act.name == "rollback") {
    int64_t before = nan_step_ > 0 ? nan_step_ : high_water_ + 1;
    for (const char* key : {"before_step", "step"})
      if (args.contains(key) && args[key].is_number()) before = args[key].get<int64_t>();
    from = find_checkpoint(checkpoint_dir_, before - 1);
    current_->detail = "to the checkpoint before step " + std::to_string(before);
  } else {
    from = find_checkpoint(checkpoint_dir_, -1);
  }
  set_state(State::recovering, act.name);
  stop_ranks();
  last_restart_ns_ = now();
  if (f.incident > 0) incidents_[size_t(f.incident - 1)].resumed_from = from.step;
  std::string error;
  if (!start_attempt(from, &error)) {
    finish("failed", error);
    return;
  }
  current_->wait = InFlight::hello;
  current_->deadline_ns = now() + int64_t(cfg_.hello_timeout_s * 1e9);
  current_->detail += (current_->detail.empty() ? "" : ", ") +
                      (from.path.empty() ? std::string("from the seed") : "from step " + std::to_string(from.step));
}

// Takes the evicted node `failed` (or the one evicted last) out and asks the
// placement plugin which standby takes its place; advance() goes on when the
// plan comes.
void Executor::begin_replace(int failed, const Action& act) {
  if (failed < 0 || slots_[size_t(failed)].role == SlotState::standby) {
    failed = -1;
    int64_t latest = 0;
    for (size_t s = 0; s < slots_.size(); ++s)
      if (slots_[s].role == SlotState::evicted && slots_[s].evicted_ns > latest)
        latest = slots_[s].evicted_ns, failed = int(s);
  }
  if (failed < 0) {
    finish("failed", "no evicted node to replace (subject '" + act.subject + "')");
    return;
  }
  // The node of `rank:N` may already be the standby that replaced it after
  // this action was asked for (the evict's implied replace ran first).
  if (slots_[size_t(failed)].role == SlotState::active && slots_[size_t(failed)].activated_ns > act.received_ns) {
    finish("superseded", slots_[size_t(failed)].name + " already replaced the node it names");
    return;
  }
  if (slots_[size_t(failed)].role == SlotState::active) {
    // Replace without evict: take it out first.
    if (std::string error; !backend_->evict(failed, eviction_reason(act), act.cause, &error)) {
      finish("failed", error);
      return;
    }
    stop_ranks();
    backend_->stop_helpers(failed);
    slots_[size_t(failed)].role = SlotState::evicted;
    slots_[size_t(failed)].evicted_ns = now();
    slots_[size_t(failed)].back = false;
    slots_[size_t(failed)].back_on_connect = false;
    slots_[size_t(failed)].replaced_by.clear();
  }
  current_->failed_slot = failed;
  // Ask the placement plugin which standby keeps the job's layout best.
  nlohmann::json nodes = nlohmann::json::array();
  for (int n = 0; n < cfg_.nodes(); ++n)
    nodes.push_back({{"name", slots_[size_t(node_slot_[size_t(n)])].name}, {"pp_stage", 0}, {"dp_row", n}});
  std::string spares;
  for (const auto& s : slots_)
    if (s.role == SlotState::standby) spares += (spares.empty() ? "" : ",") + s.name;
  if (spares.empty()) {
    finish("failed", "no standby node left");
    return;
  }
  const nlohmann::json plan = {{"job", cfg_.name + "-placement"},
                               {"gpus_per_node", cfg_.ranks_per_node},
                               {"tp", cfg_.ranks_per_node},
                               {"pp", 1},
                               {"dp", cfg_.nodes()},
                               {"nodes", nodes}};
  pending_plan_.clear();
  placement_error_.clear();
  plan_answered_ = false;
  publish_json("placement.request",
               {{"topology", job_dir_ + "/topology.conf"},
                {"replace", {{"plan", plan}, {"failed", slots_[size_t(failed)].name}, {"spares", spares}}}});
  current_->wait = InFlight::placement;
  current_->deadline_ns = now() + int64_t(cfg_.placement_timeout_s * 1e9);
  set_state(State::recovering, "replacing " + slots_[size_t(failed)].name);
  return;
}

void Executor::finish(const std::string& given, const std::string& detail) {
  if (!current_) return;
  // Refused by the fence: not done, and not to be tried again (stand_down).
  const std::string outcome = given == "failed" && backend_->fenced_off() ? "fenced" : given;
  InFlight f = std::move(*current_);
  current_.reset();
  const std::string full = f.detail.empty() ? detail : f.detail + (detail.empty() ? "" : "; " + detail);
  journal("end", f, outcome, full);
  if (f.incident > 0) {
    Incident& inc = incidents_[size_t(f.incident - 1)];
    // A pause or a checkpoint that is all the policy asked for ends the
    // incident; one followed by more actions (a checkpoint before an
    // eviction) does not.
    if (outcome == "ok" && inc.outcome == "open" && (f.action.name == "pause" || f.action.name == "checkpoint_now") &&
        queue_.empty()) {
      inc.outcome = "recovered";
      inc.resumed_ns = now();
    }
    auto& names = inc.actions;
    for (auto it = names.rbegin(); it != names.rend(); ++it)
      if (*it == f.action.name) {
        *it += ": " + outcome;
        break;
      }
  }
  log(outcome == "ok" ? BALLAST_LOG_INFO : BALLAST_LOG_WARN, "action " + std::to_string(f.action.id) + " " +
                                                                 f.action.name + ": " + outcome +
                                                                 (full.empty() ? "" : " (" + full + ")"));
  if (outcome != "failed" || ended_ || backend_->fenced_off()) return;
  Action a = f.action;
  if (queue_.retry(a, now())) {
    log(BALLAST_LOG_WARN, "action " + std::to_string(a.id) + " " + a.name + " will be tried again after a back-off");
    return;
  }
  end_job(State::escalated, a.name + " failed " + std::to_string(a.tries + 1) + " times: " + full);
}

void Executor::advance() {
  const int64_t t = now();
  // Evicted nodes come back as standbys: locally repair_seconds after the
  // eviction (the injected fault went with it); machines with agents when
  // node.back says their agent is heard again.
  for (size_t i = 0; i < slots_.size(); ++i) {
    auto& s = slots_[i];
    if (s.role != SlotState::evicted || t < s.retry_ns) continue;
    if (backend_->repaired_when_back() ? !s.back : t - s.evicted_ns < int64_t(cfg_.repair_s * 1e9)) continue;
    // Not while its replace may still be to come: the replace would find no
    // evicted node, or take the node back as its own standby.
    if (s.replaced_by.empty() && (current_ || !queue_.empty())) continue;
    if (std::string error; !backend_->restore(int(i), &error)) {
      log(BALLAST_LOG_ERROR, "cannot return the repaired " + s.name + " to the standbys (tried again after " +
                                 "repair_seconds): " + error);
      s.retry_ns = t + int64_t(cfg_.repair_s * 1e9);
      continue;
    }
    s.role = SlotState::standby;
    s.back = false;
    s.back_on_connect = false;
    log(BALLAST_LOG_INFO, s.name + " is repaired: a standby again");
  }
  if (current_) {
    auto& f = *current_;
    switch (f.wait) {
      case InFlight::hello: {
        // Up once every rank said hello; a rank that fails after its hello
        // is a new fault, one that ends before it a failed restart.
        bool all = true, lost = false;
        for (const auto& r : ranks_) {
          all = all && r.hello;
          lost = lost || (!r.hello && !r.running);
        }
        if (all) {
          set_state(State::running, "every rank is up");
          finish("ok", "");
        } else if (lost) {
          finish("failed", "a rank ended before every rank was up");
        } else if (t > f.deadline_ns) {
          char text[64];
          std::snprintf(text, sizeof text, "not every rank was up after %g s", cfg_.hello_timeout_s);
          finish("failed", text);
        }
        break;
      }
      case InFlight::checkpoint:
        if (t > f.deadline_ns) finish("failed", "no checkpoint reported in time");
        break;
      case InFlight::pause_end:
        if (t > f.deadline_ns) {
          for (int r = 0; r < cfg_.ranks; ++r) backend_->signal(r, SIGCONT);
          set_state(State::running, "resumed after the pause");
          finish("ok", "resumed");
        }
        break;
      case InFlight::placement: {
        if (!plan_answered_ && t <= f.deadline_ns) break;
        int spare = -1;
        std::string how;
        for (const auto& name : pending_plan_) {
          const int s = slot_of_subject(name);
          if (s >= 0 && slots_[size_t(s)].role == SlotState::standby) {
            spare = s;
            how = "the placement plugin chose " + name;
          }
        }
        if (spare < 0) {
          for (size_t s = 0; s < slots_.size() && spare < 0; ++s)
            if (slots_[s].role == SlotState::standby) spare = int(s);
          how = placement_error_.empty() ? "no placement plugin answered"
                                         : "the placement plugin failed (" + placement_error_ + ")";
          if (spare >= 0) how += "; took the first standby, " + slots_[size_t(spare)].name;
        }
        if (spare < 0) {
          finish("failed", "no standby node left");
          break;
        }
        for (auto& ns : node_slot_)
          if (ns == f.failed_slot) ns = spare;
        slots_[size_t(spare)].role = SlotState::active;
        slots_[size_t(spare)].activated_ns = now();
        slots_[size_t(f.failed_slot)].replaced_by = slots_[size_t(spare)].name;
        f.detail = slots_[size_t(f.failed_slot)].name + " -> " + slots_[size_t(spare)].name + " (" + how + ")";
        const Checkpoint from = find_checkpoint(checkpoint_dir_, -1);
        last_restart_ns_ = now();
        if (f.incident > 0) incidents_[size_t(f.incident - 1)].resumed_from = from.step;
        std::string error;
        if (!start_attempt(from, &error)) {
          finish("failed", error);
          break;
        }
        f.wait = InFlight::hello;
        f.deadline_ns = now() + int64_t(cfg_.hello_timeout_s * 1e9);
        f.detail += ", from step " + std::to_string(from.step);
        break;
      }
      case InFlight::none:
        break;
    }
    if (current_) return;
  }
  if (auto a = queue_.pop_due(t)) {
    begin(std::move(*a));
    return;
  }
  // A job that lost a rank and got no action for it is not left waiting.
  if (failed_ns_ != 0 && queue_.empty() && !current_ && t - failed_ns_ > int64_t(cfg_.unhandled_s * 1e9))
    end_job(State::escalated, "a rank failed and no recovery action came for " + std::to_string(int(cfg_.unhandled_s)) +
                                  " s (is a policy loaded?)");
}

// ---- events ---------------------------------------------------------------------

void Executor::publish_json(const char* topic, const nlohmann::json& j) {
  const std::string body = j.dump();
  ballast_event e{};
  e.size = sizeof e;
  e.schema = BALLAST_SCHEMA_JSON;
  e.topic = topic;
  e.source.rank = -1;
  e.payload = body.data();
  e.payload_size = body.size();
  host_->publish(host_, &e);
}

void Executor::publish_step(const Report& r) {
  std::vector<ballast_op_timing> ops;
  std::vector<std::string> names;
  names.reserve(r.ops.size() + 1);
  std::map<std::string, int> seq;
  // The straggler analysis' vocabulary (optype.cpp): the data-parallel
  // gradient all-reduce is "separate-grads-all-reduce".
  for (const auto& o : r.ops) names.push_back(o.optype == "grads-all-reduce" ? "separate-grads-all-reduce" : o.optype);
  for (size_t i = 0; i < r.ops.size(); ++i)
    ops.push_back({r.rank, 0, r.rank, r.step, names[i].c_str(), r.ops[i].start_s, r.ops[i].duration_s, seq[names[i]]++,
                   -1, -1, -1});
  if (ops.empty()) {
    names.push_back("step");
    ops.push_back({r.rank, 0, r.rank, r.step, names.back().c_str(), r.start_s, r.duration_s, 0, -1, -1, -1});
  }
  ballast_op_timing_batch b{sizeof b, uint32_t(ops.size()), ops.data()};
  ballast_event e{};
  e.size = sizeof e;
  e.schema = BALLAST_SCHEMA_OP_TIMING_BATCH;
  e.topic = "step.timing";
  e.source.rank = r.rank;
  e.payload = &b;
  e.payload_size = sizeof b;
  host_->publish(host_, &e);
}

// Per slot, the processes' CPU (cores) and resident memory, and with a
// network of its own its interfaces' bytes and TCP retransmits (rates), as
// metric.sample with node = the slot's name: the machine detector compares
// the nodes.
void Executor::sample_metrics() {
  if (cfg_.metrics_period_s <= 0) return;
  const int64_t t = now();
  if (t < next_metrics_ns_) return;
  next_metrics_ns_ = t + int64_t(cfg_.metrics_period_s * 1e9);
  const double dt = metrics_prev_ns_ ? double(t - metrics_prev_ns_) / 1e9 : 0;
  metrics_prev_ns_ = t;
  std::deque<std::string> names;  // the samples point into it
  std::vector<ballast_metric_sample> samples;
  std::map<pid_t, double> cpu_now;
  std::map<int, NetCounters> net_now;
  for (int n = 0; n < cfg_.nodes(); ++n) {
    const int slot = node_slot_[size_t(n)];
    const char* node = names.emplace_back(slots_[size_t(slot)].name).c_str();
    auto add = [&](const std::string& metric, double value) {
      samples.push_back({node, names.emplace_back(metric).c_str(), t, value, 0});
    };
    double cores = 0, rss = 0;
    bool have_rate = dt > 0;
    const std::vector<pid_t> procs = backend_->slot_processes(slot);
    for (pid_t p : procs) {
      const double c = cpu_seconds(p);
      if (c < 0) continue;
      cpu_now[p] = c;
      auto it = cpu_prev_.find(p);
      if (it == cpu_prev_.end())
        have_rate = false;
      else
        cores += (c - it->second) / dt;
      rss += rss_bytes(p);
    }
    if (have_rate) add("proc.cpu", cores);
    add("proc.rss_bytes", rss);
    if (!backend_->network_per_slot()) continue;
    NetCounters c;
    for (pid_t p : procs)
      if (read_net_counters(p, &c)) break;
    if (c.counters.empty()) continue;
    c.ns = t;
    auto prev = net_prev_.find(slot);
    if (prev != net_prev_.end() && t > prev->second.ns) {
      const double secs = double(t - prev->second.ns) / 1e9;
      for (const auto& [metric, value] : c.counters) {
        auto was = prev->second.counters.find(metric);
        if (was != prev->second.counters.end() && value >= was->second) add(metric, (value - was->second) / secs);
      }
    }
    net_now[slot] = std::move(c);
  }
  cpu_prev_ = std::move(cpu_now);
  net_prev_ = std::move(net_now);
  if (samples.empty()) return;
  ballast_metric_batch b{sizeof b, uint32_t(samples.size()), samples.data()};
  ballast_event e{};
  e.size = sizeof e;
  e.schema = BALLAST_SCHEMA_METRIC_BATCH;
  e.topic = "metric.sample";
  e.source.rank = -1;
  e.payload = &b;
  e.payload_size = sizeof b;
  host_->publish(host_, &e);
}

// What a successor carries on (handover.hpp): the newest incidents only.
Handover Executor::handover() const {
  Handover h;
  h.start_ns = first_start_ns_;
  h.attempts = std::max(attempt_ + 1, carried_figures_.attempts);
  const Handover& c = carried_figures_;
  h.have_loss = c.have_loss || !loss_.empty();
  if (h.have_loss) {
    h.loss_first = c.have_loss ? c.loss_first : loss_.begin()->second;
    h.loss_last = loss_.empty() ? c.loss_last : loss_.rbegin()->second;
  }
  const size_t keep = std::min(incidents_.size(), Handover::kIncidents);
  h.incidents.assign(incidents_.end() - std::ptrdiff_t(keep), incidents_.end());
  h.incidents_omitted = incidents_omitted_ + int64_t(incidents_.size() - keep);
  return h;
}

Summary Executor::summary() const {
  Summary s;
  s.command = cfg_.command[0];
  for (size_t i = 1; i < cfg_.command.size(); ++i) s.command += " " + cfg_.command[i];
  s.ranks = cfg_.ranks;
  s.state = state_name(state_);
  s.reason = end_reason_;
  s.start_ns = first_start_ns_;
  s.end_ns = now();
  const Handover h = handover();
  s.attempts = h.attempts;
  s.steps = loss_.empty() ? std::max<int64_t>(kept_.last_step(), 0) : loss_.rbegin()->first;
  s.have_loss = h.have_loss;
  s.loss_first = h.loss_first;
  s.loss_last = h.loss_last;
  s.kept_seconds = kept_.seconds();
  s.incidents = incidents_;
  s.incidents_omitted = incidents_omitted_;
  s.earlier_leaders = carried_;
  s.spans = spans_;
  for (auto& sp : s.spans)
    if (sp.track == "job" && sp.end_ns == 0) sp.end_ns = s.end_ns;
  return s;
}

}  // namespace ballast::runner
