#include "service.hpp"

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "plan_command.hpp"
#include "replace.hpp"

namespace ballast::sched {
namespace {

// A plan handed across the ABI, with the storage its pointers point into.
struct OwnedPlan {
  ballast_placement_plan plan{};
  std::string job, algorithm, json;
  std::vector<std::string> names;
  std::vector<ballast_placement_node> nodes;
};

struct Service {
  const ballast_host_api* host = nullptr;
  std::string topology, state_path, algorithm = "arnold";  // configuration
  TopologyOptions topo_opt;
  std::mutex mu;                 // guards everything below
  std::set<std::string> faulty;  // from fault.confirmed
  std::map<const ballast_placement_plan*, std::unique_ptr<OwnedPlan>> plans;
  uint64_t sub_request = 0, sub_fault = 0;
  bool subscribed = false;
  ballast_command command{};
  ballast_command_table commands{};
  ballast_scheduler_api api{};
};

std::unique_ptr<OwnedPlan> own(const Plan& p, const Topology& topo, const Job& job, const nlohmann::json& extra) {
  auto o = std::make_unique<OwnedPlan>();
  o->job = p.job;
  o->algorithm = p.algorithm;
  nlohmann::json j = plan_to_json(p, topo, job);
  for (auto& [k, v] : extra.items()) j[k] = v;
  o->json = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  o->names.reserve(p.nodes.size());
  for (int id : p.nodes) o->names.push_back(topo.nodes[id]);
  for (size_t r = 0; r < p.nodes.size(); ++r)
    o->nodes.push_back({o->names[r].c_str(), static_cast<int32_t>(r) / p.shape.R, static_cast<int32_t>(r) % p.shape.R,
                        static_cast<int32_t>(r * p.gpus_per_node)});
  o->plan.size = sizeof(ballast_placement_plan);
  o->plan.count = static_cast<uint32_t>(o->nodes.size());
  o->plan.job = o->job.c_str();
  o->plan.algorithm = o->algorithm.c_str();
  o->plan.nodes = o->nodes.data();
  o->plan.max_dp_spread = p.score.dp;
  o->plan.max_pp_spread = p.score.pp;
  o->plan.objective = p.score.objective;
  o->plan.lower_bound = p.lower_bound;
  return o;
}

// Availability: the state JSON (or the configured state file), plus the
// nodes the bus reported faulty.
std::vector<NodeState> availability(Service* s, const Topology& topo, const char* state_json) {
  std::vector<NodeState> st(topo.nodes.size(), kFree);
  if (state_json)
    st = parse_state(topo, state_json, "state");
  else if (!s->state_path.empty())
    st = load_state(topo, s->state_path);
  std::lock_guard<std::mutex> lock(s->mu);
  for (const auto& name : s->faulty)
    if (int id = topo.find(name); id >= 0) st[id] = kFaulty;
  return st;
}

int fail(Service* s, int status, const std::string& msg) {
  s->host->set_error(s->host, msg.c_str());
  return status;
}

ballast_placement_plan* keep(Service* s, std::unique_ptr<OwnedPlan> o) {
  ballast_placement_plan* p = &o->plan;
  std::lock_guard<std::mutex> lock(s->mu);
  s->plans.emplace(p, std::move(o));
  return p;
}

const char* opt_str(const char* p) { return p && *p ? p : nullptr; }

int api_place(void* state, const ballast_placement_request* req, ballast_placement_plan** out) {
  auto* s = static_cast<Service*>(state);
  if (!req || !out || req->size < BALLAST_PLACEMENT_REQUEST_V1_SIZE || !req->job_json)
    return fail(s, BALLAST_EINVAL, "place: request, job_json and plan are required");
  try {
    std::string topo_path = opt_str(req->topology_path) ? req->topology_path : s->topology;
    if (topo_path.empty()) return fail(s, BALLAST_EINVAL, "place: no topology_path and no configured topology");
    Topology topo = load_topology(topo_path, s->topo_opt);
    Job job = parse_job(req->job_json, "job");
    Cluster cl = make_cluster(topo, availability(s, topo, opt_str(req->state_json)));
    PlaceOptions po;
    po.algorithm = opt_str(req->algorithm) ? req->algorithm : s->algorithm;
    po.seed = req->seed;
    Plan p = place(topo, cl, job, po);
    *out = keep(s, own(p, topo, job, nlohmann::json::object()));
    return BALLAST_OK;
  } catch (const InputError& e) {
    return fail(s, BALLAST_EFORMAT, e.what());
  } catch (const std::exception& e) {
    return fail(s, BALLAST_EINTERNAL, e.what());
  }
}

int api_replace(void* state, const ballast_replacement_request* req, ballast_placement_plan** out) {
  auto* s = static_cast<Service*>(state);
  if (!req || !out || req->size < BALLAST_REPLACEMENT_REQUEST_V1_SIZE || !req->plan_json || !req->failed)
    return fail(s, BALLAST_EINVAL, "replace: request, plan_json, failed and plan are required");
  try {
    LoadedPlan lp = parse_plan(req->plan_json, "plan");
    std::string topo_path = opt_str(req->topology_path) ? req->topology_path : lp.topology;
    if (topo_path.empty()) topo_path = s->topology;
    Topology topo = load_topology(topo_path, s->topo_opt);
    auto st = availability(s, topo, opt_str(req->state_json));
    auto spares = opt_str(req->spares) ? expand_hostlist(req->spares) : std::vector<std::string>{};
    ReplaceResult r = replace_nodes(topo, st, lp, expand_hostlist(req->failed), spares);
    nlohmann::json rep = nlohmann::json::array();
    for (const auto& x : r.replaced) rep.push_back({{"failed", x.failed}, {"spare", x.spare}});
    *out = keep(s, own(r.plan, topo, lp.job, {{"replaced", rep}}));
    return BALLAST_OK;
  } catch (const InputError& e) {
    return fail(s, BALLAST_EFORMAT, e.what());
  } catch (const std::exception& e) {
    return fail(s, BALLAST_EINTERNAL, e.what());
  }
}

const char* api_plan_json(void* state, const ballast_placement_plan* plan) {
  auto* s = static_cast<Service*>(state);
  std::lock_guard<std::mutex> lock(s->mu);
  auto it = s->plans.find(plan);
  return it == s->plans.end() ? nullptr : it->second->json.c_str();
}

void api_free_plan(void* state, ballast_placement_plan* plan) {
  auto* s = static_cast<Service*>(state);
  std::unique_ptr<OwnedPlan> gone;
  std::lock_guard<std::mutex> lock(s->mu);
  auto it = s->plans.find(plan);
  if (it != s->plans.end()) {
    gone = std::move(it->second);
    s->plans.erase(it);
  }
}

void publish_error(Service* s, const std::string& msg) {
  s->host->log(s->host, BALLAST_LOG_ERROR, msg.c_str());
  s->host->counter_add(s->host, "errors", 1);
  std::string body = nlohmann::json{{"error", msg}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_JSON;
  ev.topic = "placement.error";
  ev.source.rank = -1;
  ev.payload = body.data();
  ev.payload_size = body.size();
  s->host->publish(s->host, &ev);
}

// placement.request: {"job": {...}, "topology"?: path, "state"?: {...},
// "algorithm"?, "seed"?, "replace"?: {"plan": {...}, "failed": hostlist,
// "spares"?: hostlist}} -> placement.plan (or placement.error).
int on_request(void* user, const ballast_event* ev) {
  auto* s = static_cast<Service*>(user);
  if (ev->schema != BALLAST_SCHEMA_JSON || !ev->payload) {
    publish_error(s, "placement.request: want a JSON payload");
    return BALLAST_EINVAL;
  }
  std::string text(static_cast<const char*>(ev->payload), ev->payload_size);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    publish_error(s, "placement.request: payload is not a JSON object");
    return BALLAST_EFORMAT;
  }
  auto str = [&](const nlohmann::json& o, const char* key) {
    return o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : std::string();
  };
  std::string topo = str(j, "topology"), algorithm = str(j, "algorithm");
  std::string state =
      j.contains("state") ? j["state"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) : std::string();
  ballast_placement_plan* plan = nullptr;
  int rc;
  if (j.contains("replace") && j["replace"].is_object()) {
    const auto& r = j["replace"];
    // The plan as `ballast plan --json` prints it, or a placement.plan event
    // rendered as JSON (nodes only; "alpha" may then come with the request).
    nlohmann::json plan_obj = r.contains("plan") ? r["plan"] : nlohmann::json();
    if (plan_obj.is_object() && r.contains("alpha")) plan_obj["alpha"] = r["alpha"];
    std::string plan_json =
        plan_obj.is_null() ? std::string() : plan_obj.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::string failed = str(r, "failed"), spares = str(r, "spares");
    ballast_replacement_request rr{sizeof rr,
                                   0,
                                   topo.c_str(),
                                   state.empty() ? nullptr : state.c_str(),
                                   plan_json.empty() ? nullptr : plan_json.c_str(),
                                   failed.empty() ? nullptr : failed.c_str(),
                                   spares.empty() ? nullptr : spares.c_str()};
    rc = api_replace(s, &rr, &plan);
  } else {
    std::string job =
        j.contains("job") ? j["job"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) : std::string();
    uint64_t seed = j.contains("seed") && j["seed"].is_number_unsigned() ? j["seed"].get<uint64_t>() : 0;
    ballast_placement_request pr{sizeof pr,
                                 0,
                                 topo.c_str(),
                                 job.empty() ? nullptr : job.c_str(),
                                 state.empty() ? nullptr : state.c_str(),
                                 algorithm.empty() ? nullptr : algorithm.c_str(),
                                 seed};
    rc = api_place(s, &pr, &plan);
  }
  if (rc != BALLAST_OK) {
    publish_error(s, std::string("placement.request: ") + s->host->last_error(s->host));
    return rc;
  }
  ballast_event out{};
  out.size = sizeof out;
  out.schema = BALLAST_SCHEMA_PLACEMENT_PLAN;
  out.topic = "placement.plan";
  out.source.rank = -1;
  out.payload = plan;
  out.payload_size = sizeof(ballast_placement_plan);
  s->host->publish(s->host, &out);
  s->host->counter_add(s->host, "plans", 1);
  api_free_plan(s, plan);
  return BALLAST_OK;
}

int on_fault(void* user, const ballast_event* ev) {
  auto* s = static_cast<Service*>(user);
  if (ev->schema != BALLAST_SCHEMA_FAULT_REPORT || !ev->payload || ev->payload_size < BALLAST_FAULT_REPORT_V1_SIZE ||
      static_cast<const ballast_fault_report*>(ev->payload)->size < BALLAST_FAULT_REPORT_V1_SIZE)
    return BALLAST_OK;
  const auto* r = static_cast<const ballast_fault_report*>(ev->payload);
  if (r->subject && std::string(r->subject).rfind("rank:", 0) != 0) {
    std::lock_guard<std::mutex> lock(s->mu);
    s->faulty.insert(r->subject);
  }
  return BALLAST_OK;
}

int run_plan(void*, int argc, char** argv) { return plan_command(argc, argv); }

}  // namespace

int service_create(const ballast_host_api* host, void** state) {
  auto s = std::make_unique<Service>();
  s->host = host;
  const char* v = nullptr;
  if (host->config_get && host->config_get(host, "topology", &v) == BALLAST_OK && v) s->topology = v;
  if (host->config_get && host->config_get(host, "state", &v) == BALLAST_OK && v) s->state_path = v;
  if (host->config_get && host->config_get(host, "algorithm", &v) == BALLAST_OK && v) s->algorithm = v;
  if (host->config_get && host->config_get(host, "topology_name", &v) == BALLAST_OK && v) s->topo_opt.name = v;
  if (host->config_get && host->config_get(host, "minipod_level", &v) == BALLAST_OK && v) {
    char* end = nullptr;
    long level = std::strtol(v, &end, 10);
    if (!end || *end || level < 0 || level > 64) {
      host->set_error(host, (std::string("config minipod_level: want an integer in [0, 64], got ") + v).c_str());
      return BALLAST_EINVAL;
    }
    s->topo_opt.minipod_level = static_cast<int>(level);
  }
  s->command = {"plan", "topology-aware placement, replacement of failed nodes, standby sizing", run_plan};
  s->commands = {sizeof(ballast_command_table), 1, &s->command};
  s->api = {sizeof(ballast_scheduler_api), 0, api_place, api_replace, api_plan_json, api_free_plan};
  *state = s.release();
  return BALLAST_OK;
}

int service_start(void* state) {
  auto* s = static_cast<Service*>(state);
  // Placement can take a while: queued, off the publisher's thread.
  ballast_subscribe_options queued{sizeof queued, BALLAST_DELIVER_QUEUED, 0, 0};
  int rc = s->host->subscribe(s->host, "placement.request", &queued, on_request, s, &s->sub_request);
  if (rc != BALLAST_OK) return rc;
  rc = s->host->subscribe(s->host, "fault.confirmed", nullptr, on_fault, s, &s->sub_fault);
  if (rc != BALLAST_OK) {
    s->host->unsubscribe(s->host, s->sub_request);
    return rc;
  }
  s->subscribed = true;
  return BALLAST_OK;
}

void service_stop(void* state) {
  auto* s = static_cast<Service*>(state);
  if (!s->subscribed) return;
  s->host->unsubscribe(s->host, s->sub_request);
  s->host->unsubscribe(s->host, s->sub_fault);
  s->subscribed = false;
}

void service_destroy(void* state) { delete static_cast<Service*>(state); }

const void* service_get_interface(void* state, const char* name, uint32_t version) {
  auto* s = static_cast<Service*>(state);
  std::string n = name ? name : "";
  if (n == BALLAST_COMMAND_INTERFACE && version == BALLAST_COMMAND_VERSION) return &s->commands;
  if (n == BALLAST_SCHEDULER_INTERFACE && version == BALLAST_SCHEDULER_VERSION) return &s->api;
  return nullptr;
}

}  // namespace ballast::sched
