#include "host_metrics.hpp"

#include "error.hpp"
#include "event_codec.hpp"
#include "host.hpp"
#include "metrics_http.hpp"

#include <ballast/status.h>

namespace ballast {

namespace {

struct FamilyInfo {
  const char* key;  // EventTally's name for it
  const char* name;
  const char* help;
  std::vector<const char*> labels;
};

const std::vector<FamilyInfo>& tallied() {
  static const std::vector<FamilyInfo> families = {
      {"faults",
       "ballast_fault_reports_total",
       "Fault reports seen on the bus (fault.*, node.silent)",
       {"topic", "detector", "kind"}},
      {"actions",
       "ballast_recovery_actions_total",
       "Recovery actions the policy decided (recovery.action)",
       {"action", "policy"}},
      {"outcomes",
       "ballast_action_outcomes_total",
       "Recovery actions the executor finished, by outcome (job.action)",
       {"action", "outcome"}},
      {"policy_errors", "ballast_policy_errors_total", "Policy handler failures (policy.error)", {"policy"}},
  };
  return families;
}

// A label value in the exposition format: backslash, quote and newline escaped.
std::string escape(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void header(std::string* out, const std::string& name, const char* type, const std::string& help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

std::string number(const nlohmann::json& value) { return value.is_number() ? value.dump() : "0"; }

}  // namespace

void EventTally::add(const char* family, std::vector<std::string> labels) {
  std::lock_guard lock(mutex_);
  Family& f = families_[family];
  auto it = f.series.find(labels);
  if (it != f.series.end()) {
    ++it->second;
  } else if (f.series.size() < kMaxSeries) {
    f.series.emplace(std::move(labels), 1);
  } else {
    ++f.series[std::vector<std::string>(labels.size(), "other")];
  }
}

void EventTally::count(const ballast_event& event) {
  if (event.topic == nullptr) return;
  const std::string topic = event.topic;
  nlohmann::json payload;
  try {
    payload = event_to_json(event)["payload"];
  } catch (const std::exception&) {
    return;  // out of memory: one event less in a count
  }
  auto text = [&payload](const char* key) {
    if (!payload.is_object()) return std::string();
    auto it = payload.find(key);
    return it != payload.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (topic.rfind("fault.", 0) == 0 || topic == "node.silent") {
    add("faults", {topic, text("detector"), text("kind")});
  } else if (topic == "recovery.action") {
    add("actions", {text("action"), text("policy")});
  } else if (topic == "job.action") {
    if (text("event") == "end") add("outcomes", {text("action"), text("outcome")});
  } else if (topic == "policy.error") {
    add("policy_errors", {text("policy")});
  }
}

std::string EventTally::render() const {
  std::string out;
  std::lock_guard lock(mutex_);
  for (const FamilyInfo& info : tallied()) {
    header(&out, info.name, "counter", info.help);
    auto f = families_.find(info.key);
    if (f == families_.end()) continue;
    for (const auto& [labels, count] : f->second.series) {
      out += info.name;
      for (size_t i = 0; i < labels.size(); ++i)
        out += std::string(i == 0 ? "{" : ",") + info.labels[i] + "=\"" + escape(labels[i]) + "\"";
      out += (labels.empty() ? " " : "} ") + std::to_string(count) + "\n";
    }
  }
  return out;
}

std::string render_counters(const nlohmann::json& counters, const std::string& node, size_t plugins) {
  std::string out;
  header(&out, "ballast_host_info", "gauge", "The host, by node name (always 1)");
  out += "ballast_host_info{node=\"" + escape(node) + "\"} 1\n";
  header(&out, "ballast_plugins", "gauge", "Plugins loaded, the policy included");
  out += "ballast_plugins " + std::to_string(plugins) + "\n";
  struct Known {
    const char* counter;
    const char* name;
    const char* type;
    const char* help;
  };
  static const Known known[] = {
      {"bus.published", "ballast_bus_published_total", "counter", "Events published on the bus"},
      {"bus.delivered", "ballast_bus_delivered_total", "counter", "Events delivered to subscribers"},
      {"bus.dropped", "ballast_bus_dropped_total", "counter",
       "Events dropped (lossy queues full, removed subscribers)"},
      {"bus.handler_failures", "ballast_bus_handler_failures_total", "counter", "Handlers that returned a failure"},
      {"bus.subscriptions", "ballast_bus_subscriptions", "gauge", "Subscriptions on the bus"},
      {"bus.topics", "ballast_bus_topics", "gauge", "Topics the bus has seen"},
      {"journal.failed", "ballast_journal_failed_total", "counter", "Events the journal could not write"},
      // The cluster role's (core/cluster: agent, controller, etcd leadership).
      {"cluster.forwarded", "ballast_cluster_forwarded_total", "counter", "Agent: events spooled for the controller"},
      {"cluster.last_seq", "ballast_cluster_last_seq", "gauge", "Agent: the highest sequence number spooled"},
      {"cluster.acked", "ballast_cluster_acked_seq", "gauge",
       "Agent: the highest sequence number the controller acknowledged"},
      {"cluster.resent_from_disk", "ballast_cluster_resent_from_disk_total", "counter",
       "Agent: events resent from the spool after a reconnect"},
      {"cluster.spool_overflow", "ballast_cluster_spool_overflow_total", "counter",
       "Agent: events refused by the spool's size bound (lost)"},
      {"cluster.spool_bytes", "ballast_cluster_spool_bytes", "gauge", "Agent: size of the spool on disk"},
      {"cluster.spool_errors", "ballast_cluster_spool_errors_total", "counter",
       "Agent: events the spool could not write"},
      {"cluster.connects", "ballast_cluster_connects_total", "counter", "Agent: connections made to a controller"},
      {"cluster.actions", "ballast_cluster_actions_total", "counter", "Agent: controller actions carried out"},
      {"cluster.action_repeats", "ballast_cluster_action_repeats_total", "counter",
       "Agent: controller actions received again and not carried out twice"},
      {"cluster.applied", "ballast_cluster_applied_total", "counter", "Controller: agent events applied (once each)"},
      {"cluster.duplicates", "ballast_cluster_duplicates_total", "counter",
       "Controller: agent events received again and dropped"},
      {"cluster.gaps", "ballast_cluster_gaps_total", "counter", "Controller: sequence gaps seen in an agent's events"},
      {"cluster.refused", "ballast_cluster_refused_total", "counter", "Controller: agent connections refused"},
      {"cluster.bad_frames", "ballast_cluster_bad_frames_total", "counter", "Controller: frames that did not decode"},
      {"cluster.node_silent", "ballast_cluster_node_silent_total", "counter",
       "Controller: agents gone silent past silent_after_ms (node.silent)"},
      {"cluster.node_back", "ballast_cluster_node_back_total", "counter",
       "Controller: silent agents heard again (node.back)"},
      {"cluster.actions_sent", "ballast_cluster_actions_sent_total", "counter", "Controller: actions sent to agents"},
      {"cluster.actions_fenced_off", "ballast_cluster_actions_fenced_off_total", "counter",
       "Controller: actions refused by the etcd fence (no longer the leader)"},
      {"cluster.connections", "ballast_cluster_connections_total", "counter", "Controller: agent connections accepted"},
      {"cluster.connected", "ballast_cluster_connected", "gauge", "Controller: agents connected now"},
      {"cluster.ingest_passes", "ballast_cluster_ingest_passes_total", "counter",
       "Controller: passes of its event loops that applied events (one journal write each)"},
      {"cluster.cursor_commits", "ballast_cluster_cursor_commits_total", "counter",
       "Controller: etcd transactions committing the agents' cursors"},
      {"cluster.acks_committed", "ballast_cluster_acks_committed_total", "counter",
       "Controller: acknowledged actions whose records were deleted from etcd"},
      {"cluster.log_snapshots", "ballast_cluster_log_snapshots_total", "counter",
       "Controller candidate: plugins' snapshot records, each replacing the plugin's earlier ones"},
      {"cluster.leader", "ballast_cluster_leader", "gauge", "Controller candidate: 1 while it leads"},
      {"cluster.terms", "ballast_cluster_terms_total", "counter", "Controller candidate: terms won"},
      {"cluster.deposed", "ballast_cluster_deposed_total", "counter", "Controller candidate: terms lost"},
      {"cluster.etcd_errors", "ballast_cluster_etcd_errors_total", "counter",
       "Controller candidate: etcd requests failed"},
      {"cluster.elected_at_ms", "ballast_cluster_elected_at_ms", "gauge",
       "Controller candidate: when its current term began (Unix ms)"},
  };
  for (const Known& k : known) {
    auto it = counters.find(k.counter);
    if (it == counters.end()) continue;
    header(&out, k.name, k.type, k.help);
    out += std::string(k.name) + " " + number(*it) + "\n";
  }
  // Plugins' counters ("<plugin>.<name>", ballast_host_api.counter_add): one
  // family, labelled, whatever their names.
  header(&out, "ballast_plugin_counter", "untyped", "Each plugin's counters (counter_add), the policy's included");
  for (const auto& [name, value] : counters.items()) {
    bool is_known = false;
    for (const Known& k : known) is_known = is_known || name == k.counter;
    const size_t dot = name.find('.');
    if (is_known || dot == std::string::npos) continue;
    out += "ballast_plugin_counter{plugin=\"" + escape(name.substr(0, dot)) + "\",counter=\"" +
           escape(name.substr(dot + 1)) + "\"} " + number(value) + "\n";
  }
  return out;
}

int HostMetrics::create(Host& host, const std::string& listen, std::unique_ptr<HostMetrics>* out) {
  auto metrics = std::unique_ptr<HostMetrics>(new HostMetrics());
  metrics->host_ = &host;
  // Lossy: a slow scrape never holds back a publisher (what is dropped shows in bus.dropped).
  const ballast_subscribe_options options{sizeof options, BALLAST_DELIVER_QUEUED, BALLAST_SUBSCRIBE_LOSSY, 0};
  for (const char* pattern : {"fault.*", "node.silent", "recovery.action", "job.action", "policy.error"}) {
    uint64_t id = 0;
    if (int rc = host.subscribe(pattern, &options, on_event, metrics.get(), "metrics", &id); rc != BALLAST_OK) {
      for (uint64_t s : metrics->subscriptions_) host.unsubscribe(s);
      return rc;
    }
    metrics->subscriptions_.push_back(id);
  }
  HostMetrics* self = metrics.get();
  if (int rc = MetricsHttp::open(
          listen, [self] { return self->render(); }, &metrics->http_);
      rc != BALLAST_OK) {
    for (uint64_t s : metrics->subscriptions_) host.unsubscribe(s);
    return rc;
  }
  *out = std::move(metrics);
  return BALLAST_OK;
}

HostMetrics::~HostMetrics() {
  http_.reset();  // no scrape after this
  for (uint64_t id : subscriptions_) host_->unsubscribe(id);
}

const std::string& HostMetrics::url() const { return http_->url(); }

std::string HostMetrics::render() const {
  return render_counters(host_->counters(), host_->node(), host_->plugin_count()) + tally_.render();
}

int HostMetrics::on_event(void* user, const ballast_event* event) {
  static_cast<HostMetrics*>(user)->tally_.count(*event);
  return 0;
}

}  // namespace ballast
