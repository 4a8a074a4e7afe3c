// ballast-runner: the executor as a plugin. It owns the job its config
// names, carries out recovery.action events, reports crashes, steps and
// per-node metrics, and answers `ballast run` with a report at the end.
// Loaded by a cluster agent with a `relay` table instead, it is the node's
// end of the relayed job channel (relay.hpp) and runs no job.
#include "executor.hpp"
#include "local_backend.hpp"
#include "relay.hpp"
#include "slurm_backend.hpp"

#include <ballast/events.h>
#include <ballast/plugin.h>

#include <unistd.h>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

namespace {

using namespace ballast::runner;

struct State {
  const ballast_host_api* host = nullptr;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Relay> relay;  // instead of the executor, on a node's agent
  std::vector<uint64_t> subscriptions;
};

int fail(const ballast_host_api* host, int status, const std::string& msg) {
  host->set_error(host, msg.c_str());
  return status;
}

// A config value as JSON: tables come as JSON text, the rest as plain text.
nlohmann::json config_json(const ballast_host_api* host, const char* key) {
  const char* v = nullptr;
  if (!host->config_get || host->config_get(host, key, &v) != BALLAST_OK || !v) return nullptr;
  nlohmann::json j = nlohmann::json::parse(v, nullptr, false);
  if (!j.is_discarded() && (j.is_object() || j.is_array())) return j;
  return std::string(v);
}

int create(const ballast_host_api* host, void** state) {
  auto s = std::make_unique<State>();
  s->host = host;
  try {
    if (const nlohmann::json relay = config_json(host, "relay"); !relay.is_null()) {
      // What `ballast run` fills from its command line is the executor's.
      for (const char* key : {"inject", "inject_schedule", "timeline"})
        if (!config_json(host, key).is_null())
          return fail(host, BALLAST_EINVAL,
                      std::string(key) + ": the relay runs no job (faults and timelines are the executor's)");
      for (const char* key : {"report", "base_dir", "schedule_seconds_per_day"}) config_json(host, key);
      s->relay = std::make_unique<Relay>(
          host, parse_relay_config(relay.is_string() ? relay.get<std::string>() : relay.dump()));
      *state = s.release();
      return BALLAST_OK;
    }
    const nlohmann::json job = config_json(host, "job");
    if (job.is_null()) return fail(host, BALLAST_EINVAL, "config: no job table (job = { command = {...}, ranks = N })");
    nlohmann::json top = nlohmann::json::object();
    for (const char* key : {"inject", "inject_schedule", "timeline", "report", "base_dir"}) {
      nlohmann::json v = config_json(host, key);
      if (!v.is_null()) top[key] = v;
    }
    if (const nlohmann::json v = config_json(host, "schedule_seconds_per_day"); v.is_string())
      top["schedule_seconds_per_day"] = std::atof(v.get<std::string>().c_str());
    char cwd[4096];
    std::string base = top.contains("base_dir") && top["base_dir"].is_string() ? top["base_dir"].get<std::string>()
                                                                               : (getcwd(cwd, sizeof cwd) ? cwd : ".");
    JobConfig cfg = parse_job_config(job, top, base);
    std::unique_ptr<Backend> backend;
    if (cfg.backend == "slurm")
      backend = std::make_unique<SlurmBackend>(cfg.slurm, cfg.name, cfg.nodes());
    else
      backend = std::make_unique<LocalBackend>(cfg.cgroups, cfg.netns);
    s->executor = std::make_unique<Executor>(host, std::move(cfg), std::move(backend));
    // The hang detector, created after this plugin, finds the job's trace
    // rings through BALLAST_TRACE_DIR.
    std::string error;
    if (!s->executor->prepare_trace_dir(&error)) return fail(host, BALLAST_EIO, error);
    setenv("BALLAST_TRACE_DIR", s->executor->trace_dir().c_str(), 1);
  } catch (const std::exception& e) {
    return fail(host, BALLAST_EINVAL, e.what());
  }
  *state = s.release();
  return BALLAST_OK;
}

int on_action(void* user, const ballast_event* ev) {
  if (ev->schema != BALLAST_SCHEMA_RECOVERY_ACTION || !ev->payload ||
      ev->payload_size < sizeof(ballast_recovery_action))
    return BALLAST_OK;
  static_cast<State*>(user)->executor->post_action(*static_cast<const ballast_recovery_action*>(ev->payload),
                                                   ev->ts_ns);
  return BALLAST_OK;
}

int on_fault(void* user, const ballast_event* ev) {
  if (ev->schema != BALLAST_SCHEMA_FAULT_REPORT || !ev->payload || ev->payload_size < sizeof(ballast_fault_report))
    return BALLAST_OK;
  static_cast<State*>(user)->executor->post_fault(ev->topic, *static_cast<const ballast_fault_report*>(ev->payload),
                                                  ev->ts_ns);
  return BALLAST_OK;
}

// The node a cluster controller's JSON event names ({"node": name, ...}),
// "" when it names none.
std::string node_named(const ballast_event* ev) {
  if (ev->schema != BALLAST_SCHEMA_JSON || !ev->payload) return {};
  const auto* text = static_cast<const char*>(ev->payload);
  const auto j = nlohmann::json::parse(text, text + ev->payload_size, nullptr, false);
  return j.is_object() && j.contains("node") && j["node"].is_string() ? j["node"].get<std::string>() : std::string();
}

// node.back (the cluster controller).
int on_back(void* user, const ballast_event* ev) {
  const std::string node = node_named(ev);
  if (!node.empty()) static_cast<State*>(user)->executor->post_back(node);
  return BALLAST_OK;
}

// controller.leader (a new term, with the earlier leaders' records) and
// node.connected ({"node": name, ...}), from the cluster controller.
int on_leader(void* user, const ballast_event* ev) {
  if (ev->schema != BALLAST_SCHEMA_JSON || !ev->payload) return BALLAST_OK;
  static_cast<State*>(user)->executor->post_leader(
      std::string(static_cast<const char*>(ev->payload), ev->payload_size));
  return BALLAST_OK;
}

int on_connected(void* user, const ballast_event* ev) {
  const std::string node = node_named(ev);
  if (!node.empty()) static_cast<State*>(user)->executor->post_connected(node);
  return BALLAST_OK;
}

// job.rank_report: a rank's report through its node's agent.
int on_relayed(void* user, const ballast_event* ev) {
  if (ev->schema != BALLAST_SCHEMA_JSON || !ev->payload) return BALLAST_OK;
  static_cast<State*>(user)->executor->post_relayed(
      std::string(static_cast<const char*>(ev->payload), ev->payload_size));
  return BALLAST_OK;
}

int on_straggler(void* user, const ballast_event* ev) {
  if (ev->schema != BALLAST_SCHEMA_STRAGGLER_REPORT || !ev->payload ||
      ev->payload_size < sizeof(ballast_straggler_report))
    return BALLAST_OK;
  static_cast<State*>(user)->executor->post_straggler(*static_cast<const ballast_straggler_report*>(ev->payload),
                                                      ev->ts_ns);
  return BALLAST_OK;
}

int on_plan(void* user, const ballast_event* ev) {
  auto* s = static_cast<State*>(user);
  if (ev->schema == BALLAST_SCHEMA_PLACEMENT_PLAN && ev->payload && ev->payload_size >= sizeof(ballast_placement_plan))
    s->executor->post_plan(*static_cast<const ballast_placement_plan*>(ev->payload));
  else if (ev->schema == BALLAST_SCHEMA_JSON && ev->payload)
    s->executor->post_placement_error(std::string(static_cast<const char*>(ev->payload), ev->payload_size));
  return BALLAST_OK;
}

int start(void* state) {
  auto* s = static_cast<State*>(state);
  std::string error;
  if (s->relay) return s->relay->start(&error) ? BALLAST_OK : fail(s->host, BALLAST_EIO, error);
  struct Sub {
    const char* pattern;
    ballast_handler handler;
  };
  // Inline: the handlers only copy the event into the executor's inbox (so
  // controller.leader is there before the new leader allows any action).
  for (const Sub& sub :
       {Sub{"recovery.action", on_action}, Sub{"fault.*", on_fault}, Sub{"node.silent", on_fault},
        Sub{"node.back", on_back}, Sub{"controller.leader", on_leader}, Sub{"node.connected", on_connected},
        Sub{"straggler.report", on_straggler}, Sub{"placement.plan", on_plan}, Sub{"placement.error", on_plan},
        Sub{"job.rank_report", on_relayed}}) {
    uint64_t id = 0;
    const int rc = s->host->subscribe(s->host, sub.pattern, nullptr, sub.handler, s, &id);
    if (rc != BALLAST_OK) return rc;
    s->subscriptions.push_back(id);
  }
  if (!s->executor->start(&error)) return fail(s->host, BALLAST_EIO, error);
  return BALLAST_OK;
}

void stop(void* state) {
  auto* s = static_cast<State*>(state);
  if (s->relay) {
    s->relay->stop();
    return;
  }
  s->executor->stop();
  for (uint64_t id : s->subscriptions) s->host->unsubscribe(s->host, id);
  s->subscriptions.clear();
}

void destroy(void* state) { delete static_cast<State*>(state); }

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor),
    BALLAST_ABI_MAJOR,
    BALLAST_ABI_MINOR,
    0,
    "runner",
    "0.1.0",
    "scheduler",
    "the executor: runs a training job's ranks, carries out recovery actions, injects faults, reports",
    create,
    start,
    stop,
    destroy,
    nullptr,
    nullptr};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t) { return &kDescriptor; }
