// ballast-fusion: one ranked list of suspects per job. Subscribes to the
// detectors' suspicions (fault.*, node.silent, straggler.report) and to
// placement.plan (ranks to nodes); publishes suspects.ranking (JSON) when the
// list changes; adds the `ballast suspects` command. Logic in fusion.cpp.
#include "fusion.hpp"
#include "fusion_json.hpp"
#include "suspects_command.hpp"

#include <ballast/ballast.h>

#include <cmath>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace {

using ballast::fusion::Fusion;
using ballast::fusion::FusionConfig;
using ballast::fusion::Suspicion;

struct State {
  const ballast_host_api* host;
  std::mutex mu;  // guards fusion and last_key: dispatcher threads share them
  Fusion fusion;
  std::string last_key;
  std::vector<uint64_t> subs;
  State(const ballast_host_api* h, FusionConfig c) : host(h), fusion(c) {}
};

std::string str(const char* s) { return s ? s : ""; }

void publish_if_changed(State* s, int64_t now) {
  std::string text;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    auto ranking = s->fusion.ranking(now);
    std::string key = ballast::fusion::ranking_key(ranking);
    if (key == s->last_key) return;
    s->last_key = key;
    text = ballast::fusion::ranking_json(ranking, now).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_JSON;
  ev.topic = "suspects.ranking";
  ev.ts_ns = now;
  ev.source = {nullptr, -1, nullptr};
  ev.payload = text.data();
  ev.payload_size = text.size();
  s->host->publish(s->host, &ev);
  s->host->counter_add(s->host, "rankings", 1);
}

int on_event(void* user, const ballast_event* ev) {
  auto* s = static_cast<State*>(user);
  int64_t now = ev->ts_ns ? ev->ts_ns : s->host->now_ns(s->host);
  try {
    std::unique_lock<std::mutex> lock(s->mu);
    if (ev->schema == BALLAST_SCHEMA_FAULT_REPORT && ev->payload && ev->payload_size >= sizeof(ballast_fault_report)) {
      const auto* r = static_cast<const ballast_fault_report*>(ev->payload);
      if (r->size < sizeof(ballast_fault_report)) return 0;
      Suspicion x;
      x.detector = r->detector ? r->detector : str(ev->source.plugin);
      x.subject = str(r->subject);
      x.rank = r->rank;
      x.node = str(ev->source.node);
      x.kind = str(r->kind);
      x.metric = str(r->metric);
      x.score = std::isfinite(r->score) ? r->score : 0;
      x.confidence = std::isfinite(r->confidence) ? r->confidence : 0;
      x.confirmed = r->stage == BALLAST_FAULT_CONFIRMED || std::string(ev->topic) == "node.silent";
      x.since_ns = r->since_ns ? r->since_ns : now;
      x.at_ns = r->detected_ns ? r->detected_ns : now;
      x.evidence = str(r->evidence);
      if (x.subject.empty() && x.rank < 0) return 0;
      s->fusion.add(std::move(x));
    } else if (ev->schema == BALLAST_SCHEMA_STRAGGLER_REPORT && ev->payload &&
               ev->payload_size >= sizeof(ballast_straggler_report)) {
      const auto* r = static_cast<const ballast_straggler_report*>(ev->payload);
      if (r->size < sizeof(ballast_straggler_report) || (r->count && !r->culprits)) return 0;
      for (uint32_t i = 0; i < r->count; ++i) {
        const ballast_straggler_culprit& c = r->culprits[i];
        if (!c.dimension || std::string(c.dimension) != "rank" || !c.name) continue;
        char* end = nullptr;
        long rank = std::strtol(c.name, &end, 10);
        if (*end || end == c.name || rank < 0 || rank > INT32_MAX) continue;
        nlohmann::json evidence = {{"slowdown", r->slowdown}, {"culprit_slowdown", c.slowdown}, {"kind", str(r->kind)}};
        s->fusion.add_straggler(static_cast<int32_t>(rank), str(r->kind), c.slowdown, r->slowdown, now,
                                evidence.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      }
    } else if (ev->schema == BALLAST_SCHEMA_PLACEMENT_PLAN && ev->payload &&
               ev->payload_size >= sizeof(ballast_placement_plan)) {
      const auto* p = static_cast<const ballast_placement_plan*>(ev->payload);
      if (p->size < sizeof(ballast_placement_plan) || (p->count && !p->nodes)) return 0;
      std::vector<std::pair<std::string, int32_t>> nodes;
      for (uint32_t i = 0; i < p->count; ++i) nodes.emplace_back(str(p->nodes[i].name), p->nodes[i].first_rank);
      s->fusion.set_placement(std::move(nodes));
      return 0;
    } else {
      return 0;
    }
    lock.unlock();
    publish_if_changed(s, now);
  } catch (const std::exception&) {
    s->host->counter_add(s->host, "events_failed", 1);  // out of memory: never across the ABI
    return -1;
  }
  return 0;
}

int create(const ballast_host_api* host, void** state) {
  FusionConfig c;
  struct Num {
    const char* key;
    double* field;
    double min;
  };
  double ranks_per_node = 0, max_suspects = static_cast<double>(c.max_suspects);
  Num nums[] = {{"half_life", &c.half_life_s, 0},
                {"min_score", &c.min_score, 0},
                {"suspected_weight", &c.suspected_weight, 0},
                {"straggler_weight", &c.straggler_weight, 0},
                {"ranks_per_node", &ranks_per_node, 0},
                {"max_suspects", &max_suspects, 1}};
  for (const Num& n : nums) {
    const char* v = nullptr;
    if (host->config_get(host, n.key, &v) != BALLAST_OK || !v) continue;
    char* end = nullptr;
    double d = std::strtod(v, &end);
    if (end == v || *end || !(d >= n.min) || d > 1e9) {
      std::string msg = std::string("config key '") + n.key + "': expected a number >= " + std::to_string(n.min) +
                        ", got '" + v + "'";
      host->set_error(host, msg.c_str());
      return BALLAST_EINVAL;
    }
    *n.field = d;
  }
  c.ranks_per_node = static_cast<int>(ranks_per_node);
  c.max_suspects = static_cast<size_t>(max_suspects);
  auto* s = new (std::nothrow) State(host, c);
  if (!s) return BALLAST_ENOMEM;
  *state = s;
  return BALLAST_OK;
}

int start(void* state) {
  auto* s = static_cast<State*>(state);
  ballast_subscribe_options opt{sizeof opt, BALLAST_DELIVER_QUEUED, 0, 0};
  for (const char* topic : {"fault.*", "node.silent", "straggler.report", "placement.plan"}) {
    uint64_t id = 0;
    int rc = s->host->subscribe(s->host, topic, &opt, on_event, s, &id);
    if (rc != BALLAST_OK) return rc;
    s->subs.push_back(id);
  }
  return BALLAST_OK;
}

void stop(void* state) {
  auto* s = static_cast<State*>(state);
  for (uint64_t id : s->subs) s->host->unsubscribe(s->host, id);
  s->subs.clear();
}

void destroy(void* state) { delete static_cast<State*>(state); }

int run_suspects(void*, int argc, char** argv) { return ballast::fusion::suspects_main(argc, argv); }

const ballast_command kCommands[] = {
    {"suspects", "replay recorded events through the suspect fusion: one ranked list per job", run_suspects}};
const ballast_command_table kCommandTable = {sizeof(ballast_command_table), 1, kCommands};

const void* get_interface(void*, const char* name, uint32_t version) {
  if (std::string(name) == BALLAST_COMMAND_INTERFACE && version == BALLAST_COMMAND_VERSION) return &kCommandTable;
  return nullptr;
}

const ballast_interface_info kInterfaces[] = {{BALLAST_COMMAND_INTERFACE, BALLAST_COMMAND_VERSION}, {nullptr, 0}};

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor),
    BALLAST_ABI_MAJOR,
    BALLAST_ABI_MINOR,
    0,
    "fusion",
    "0.1.0",
    "detector",
    "suspect fusion: one ranked list of suspects per job from every detector's suspicions",
    create,
    start,
    stop,
    destroy,
    get_interface,
    kInterfaces};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t) { return &kDescriptor; }
