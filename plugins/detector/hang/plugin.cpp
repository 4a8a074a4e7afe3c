// ballast-hang: the collective hang detector as a plugin (watches the trace
// rings of a folder and publishes fault.confirmed), and the commands
// `ballast analyze` and `ballast launch`.
#include "analysis.hpp"
#include "hang_commands.hpp"
#include "heartbeat.hpp"

#include <nlohmann/json.hpp>

#include <ballast/command.h>
#include <ballast/events.h>
#include <ballast/plugin.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <string>

namespace {

using namespace ballast::hang;

int64_t wall_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct State {
  const ballast_host_api* host = nullptr;
  std::string dir;
  double stall_s = 10;
  double period_s = 0.5;
  uint64_t timer = 0;
  bool timing = false;
  std::mutex mu;  // the timer thread and stop()
  uint64_t signature = 0;
  int64_t last_change_ns = 0;
  int64_t last_tick_ns = 0;
  std::set<std::pair<uint64_t, uint64_t>> reported;  // (comm, seq) already published
  bool paused = false;                               // the executor stopped the job on purpose (job.state "paused")
  uint64_t sub_state = 0;
  bool subscribed = false;
};

// A job the executor paused makes no progress on purpose: it is not hung.
// The stall clock starts again when it resumes.
int on_job_state(void* user, const ballast_event* ev) {
  auto* s = static_cast<State*>(user);
  if (ev->schema != BALLAST_SCHEMA_JSON || !ev->payload) return BALLAST_OK;
  const auto* text = static_cast<const char*>(ev->payload);
  const auto body = nlohmann::json::parse(text, text + ev->payload_size, nullptr, false);
  if (!body.is_object()) return BALLAST_OK;
  const auto state = body.find("state");
  const bool paused = state != body.end() && *state == "paused";
  std::lock_guard<std::mutex> lock(s->mu);
  if (s->paused && !paused) s->last_change_ns = wall_now();
  s->paused = paused;
  return BALLAST_OK;
}

// evidence: the verdict's JSON, or that with more (the ranks' stacks).
// hosts: each rank's machine (its ring's or heartbeat's host), published as
// the event's source.node so that the suspect fusion folds the rank into it.
void publish(State* s, const Verdict& v, int64_t since_ns, const char* metric, const std::map<int, std::string>& hosts,
             const std::string& evidence_json = "") {
  const int64_t now = wall_now();
  for (const auto& c : v.causes) {
    const auto host = hosts.find(c.rank);
    const std::string subject = "rank:" + std::to_string(c.rank);
    const std::string evidence = evidence_json.empty() ? v.to_json() : evidence_json;
    ballast_fault_report f{};
    f.size = sizeof f;
    f.stage = BALLAST_FAULT_CONFIRMED;
    f.subject = subject.c_str();
    f.rank = c.rank;
    f.kind = c.kind.c_str();
    f.metric = metric;
    f.score = double(now - since_ns) / 1e9;  // seconds without progress when detected
    f.confidence = 1.0;
    f.since_ns = since_ns;
    f.detected_ns = now;
    f.evidence = evidence.c_str();
    f.detector = "hang";
    ballast_event e{};
    e.size = sizeof e;
    e.schema = BALLAST_SCHEMA_FAULT_REPORT;
    e.topic = "fault.confirmed";
    e.source.rank = c.rank;
    e.source.node = host != hosts.end() && !host->second.empty() ? host->second.c_str() : nullptr;
    e.payload = &f;
    e.payload_size = sizeof f;
    s->host->publish(s->host, &e);
  }
}

// Ranks that write no trace ring (no Ballast comm plugin) are watched
// through their heartbeat files: a stall of every heartbeat is a hang.
void on_heartbeats(State* s, const std::vector<Heartbeat>& beats, int64_t now) {
  const uint64_t sig = heartbeat_signature(beats);
  if (sig != s->signature) {
    s->signature = sig;
    s->last_change_ns = now;
    return;
  }
  if (!heartbeats_running(beats) || double(now - s->last_change_ns) / 1e9 < s->stall_s) return;
  const Verdict v = analyze_heartbeats(beats);
  // One report per stall: keyed by the stalled signature.
  if (v.verdict == "healthy" || v.causes.empty() || !s->reported.insert({0, sig}).second) return;
  // The evidence carries each live rank's Python stacks (those that offer a
  // stack signal), as `ballast launch` prints them.
  auto evidence = nlohmann::json::parse(v.to_json());
  evidence["stacks"] = nlohmann::json::object();
  for (const auto& [rank, stack] : collect_stacks(s->dir, beats, 1000))
    evidence["stacks"][std::to_string(rank)] = stack;
  std::map<int, std::string> hosts;
  for (const auto& b : beats) hosts[b.rank] = b.host;
  publish(s, v, v.last_progress_ns ? v.last_progress_ns : s->last_change_ns, "heartbeat", hosts, evidence.dump());
}

void on_tick(void* user) {
  auto* s = static_cast<State*>(user);
  std::lock_guard<std::mutex> lock(s->mu);
  if (s->paused) return;
  std::vector<std::string> errors;
  const auto rings = read_dir(s->dir, &errors);
  const int64_t now = wall_now();
  if (rings.empty()) {
    on_heartbeats(s, read_heartbeats(s->dir, &errors), now);
    return;
  }
  const uint64_t sig = progress_signature(rings);
  const int64_t previous_tick_ns = s->last_tick_ns;
  s->last_tick_ns = now;
  if (sig != s->signature) {
    s->signature = sig;
    // The stall clock starts at the last progress the rings recorded, up to
    // a period before this tick saw it: never before the last tick or the
    // clock's last start, nor after now, whatever the writers' clocks say.
    const int64_t earliest = std::min(std::max(previous_tick_ns, s->last_change_ns), now);
    s->last_change_ns = std::clamp(last_progress_ns(rings), earliest, now);
    if (!any_failed(rings)) return;
  }
  const bool stalled = in_flight(rings) && double(now - s->last_change_ns) / 1e9 >= s->stall_s;
  if (!stalled && !any_failed(rings)) return;
  const Verdict v = analyze(rings, Options{});
  if (v.verdict == "healthy" || v.causes.empty() || !s->reported.insert({v.comm_id, v.seq}).second) return;
  std::map<int, std::string> hosts;
  for (const auto& r : rings)
    hosts[r.header.rank] = std::string(r.header.host, strnlen(r.header.host, sizeof r.header.host));
  publish(s, v, v.last_progress_ns ? v.last_progress_ns : s->last_change_ns, "collective.progress", hosts);
}

int create(const ballast_host_api* host, void** state) {
  auto* s = new (std::nothrow) State();
  if (!s) return BALLAST_ENOMEM;
  s->host = host;
  const char* env = std::getenv("BALLAST_TRACE_DIR");
  s->dir = env && *env ? env : "/dev/shm";
  const char* v = nullptr;
  if (host->config_get && host->config_get(host, "trace_dir", &v) == BALLAST_OK) s->dir = v;
  if (host->config_get && host->config_get(host, "stall_seconds", &v) == BALLAST_OK) s->stall_s = std::atof(v);
  if (host->config_get && host->config_get(host, "period_seconds", &v) == BALLAST_OK) s->period_s = std::atof(v);
  if (s->stall_s <= 0 || s->period_s <= 0) {
    host->set_error(host, "hang: stall_seconds and period_seconds must be positive");
    delete s;
    return BALLAST_EINVAL;
  }
  *state = s;
  return BALLAST_OK;
}

int start(void* state) {
  auto* s = static_cast<State*>(state);
  s->last_change_ns = wall_now();
  s->subscribed = s->host->subscribe(s->host, "job.state", nullptr, on_job_state, s, &s->sub_state) == BALLAST_OK;
  const int rc = s->host->timer_start(s->host, uint64_t(s->period_s * 1e9), on_tick, s, &s->timer);
  s->timing = rc == BALLAST_OK;
  return rc;
}

void stop(void* state) {
  auto* s = static_cast<State*>(state);
  if (s->timing) s->host->timer_cancel(s->host, s->timer);
  if (s->subscribed) s->host->unsubscribe(s->host, s->sub_state);
  s->timing = s->subscribed = false;
}

void destroy(void* state) { delete static_cast<State*>(state); }

int run_analyze(void*, int argc, char** argv) { return analyze_main(argc, argv); }
int run_launch(void*, int argc, char** argv) { return launch_main(argc, argv); }

const ballast_command kCommands[] = {
    {"analyze", "root cause of a hung or failed collective from trace rings (DIR)", run_analyze},
    {"launch", "start N local ranks (torchrun environment), watch them, explain a failure or hang", run_launch}};
const ballast_command_table kCommandTable = {sizeof(ballast_command_table), 2, kCommands};

const void* get_interface(void*, const char* name, uint32_t version) {
  if (name && std::string(name) == BALLAST_COMMAND_INTERFACE && version == BALLAST_COMMAND_VERSION)
    return &kCommandTable;
  return nullptr;
}

const ballast_interface_info kInterfaces[] = {{BALLAST_COMMAND_INTERFACE, BALLAST_COMMAND_VERSION}, {nullptr, 0}};

const ballast_plugin_descriptor kDescriptor = {sizeof(ballast_plugin_descriptor),
                                               BALLAST_ABI_MAJOR,
                                               BALLAST_ABI_MINOR,
                                               0,
                                               "hang",
                                               "0.1.0",
                                               "detector",
                                               "collective hang detector: root cause (crashed, stuck, not_joined, "
                                               "slow, mismatch) from trace rings (after Mycroft)",
                                               create,
                                               start,
                                               stop,
                                               destroy,
                                               get_interface,
                                               kInterfaces};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t) { return &kDescriptor; }
