#include "role.hpp"

#include "agent.hpp"
#include "config_file.hpp"
#include "controller.hpp"
#include "error.hpp"
#include "host.hpp"
#include "leader.hpp"

#include <atomic>
#include <filesystem>

namespace fs = std::filesystem;

namespace ballast::cluster {

namespace {

struct Reader {
  const nlohmann::json& table;
  std::string base_dir;

  const nlohmann::json* at(const char* key) const { return config_lookup(table, key); }
  int string(const char* key, std::string* out, bool path = false) const {
    const nlohmann::json* v = at(key);
    if (v == nullptr) return BALLAST_OK;
    if (!v->is_string())
      return fail(BALLAST_EINVAL, std::string("config field 'cluster.") + key + "': expected a string");
    *out = v->get<std::string>();
    if (path && fs::path(*out).is_relative()) *out = (fs::path(base_dir) / *out).string();
    return BALLAST_OK;
  }
  int number(const char* key, double lo, double hi, double* out) const {
    const nlohmann::json* v = at(key);
    if (v == nullptr) return BALLAST_OK;
    if (!v->is_number() || v->get<double>() < lo || v->get<double>() > hi)
      return fail(BALLAST_EINVAL, std::string("config field 'cluster.") + key + "': expected a number in " +
                                      std::to_string(static_cast<long long>(lo)) + ".." +
                                      std::to_string(static_cast<long long>(hi)));
    *out = v->get<double>();
    return BALLAST_OK;
  }
  int boolean(const char* key, bool* out) const {
    const nlohmann::json* v = at(key);
    if (v == nullptr) return BALLAST_OK;
    if (!v->is_boolean())
      return fail(BALLAST_EINVAL, std::string("config field 'cluster.") + key + "': expected true or false");
    *out = v->get<bool>();
    return BALLAST_OK;
  }
  int strings(const char* key, std::vector<std::string>* out) const {
    const nlohmann::json* v = at(key);
    if (v == nullptr) return BALLAST_OK;
    if (v->is_string()) {
      *out = {v->get<std::string>()};
      return BALLAST_OK;
    }
    if (!v->is_array() || v->empty())
      return fail(BALLAST_EINVAL,
                  std::string("config field 'cluster.") + key + "': expected a string or a list of strings");
    out->clear();
    for (const auto& e : *v) {
      if (!e.is_string())
        return fail(BALLAST_EINVAL, std::string("config field 'cluster.") + key + "': expected strings");
      out->push_back(e.get<std::string>());
    }
    return BALLAST_OK;
  }
};

#define TRY(expr)                                        \
  do {                                                   \
    if (int rc_ = (expr); rc_ != BALLAST_OK) return rc_; \
  } while (0)

int common(const Reader& r, TlsFiles* tls, int* heartbeat_ms, int* silent_after_ms) {
  TRY(r.string("tls.ca", &tls->ca, true));
  TRY(r.string("tls.cert", &tls->cert, true));
  TRY(r.string("tls.key", &tls->key, true));
  TRY(r.string("tls.server_name", &tls->server_name));
  double hb = *heartbeat_ms, silent = *silent_after_ms;
  TRY(r.number("heartbeat_ms", 10, 60000, &hb));
  TRY(r.number("silent_after_ms", 50, 3600000, &silent));
  if (silent < 2 * hb)
    return fail(BALLAST_EINVAL, "config field 'cluster.silent_after_ms': must be at least twice heartbeat_ms");
  *heartbeat_ms = static_cast<int>(hb);
  *silent_after_ms = static_cast<int>(silent);
  return BALLAST_OK;
}

class AgentRole : public Role {
 public:
  std::unique_ptr<Agent> agent;
  int start() override { return agent->start(); }
  void stop() override { agent->stop(); }
  nlohmann::json counters() const override { return agent->counters(); }
};

class ControllerRole : public Role {
 public:
  Host* host = nullptr;
  ControllerOptions options;
  EtcdOptions etcd;
  std::unique_ptr<EtcdLeadership> leadership;
  std::unique_ptr<Controller> controller;
  std::atomic<Controller*> serving{nullptr};  // the controller, once started
  ~ControllerRole() override {
    // A candidate's plugins may not act once its role is gone.
    if (leadership)
      host->set_action_fence([name = etcd.name](const std::string&, const std::string& kind, const nlohmann::json&) {
        return fail(BALLAST_EFENCED, kind + " fenced off: the controller role of " + name + " has stopped");
      });
  }
  // With etcd, the plugins' fence_action (plugin.h): recorded and allowed
  // only while this candidate leads.
  void install_fence() {
    host->set_action_fence([this](const std::string& plugin, const std::string& kind, const nlohmann::json& record) {
      Controller* c = serving.load();
      if (c == nullptr)
        return fail(BALLAST_EFENCED, kind + " (" + plugin + ") fenced off: " + etcd.name + " has not begun to lead");
      return c->fence_action(plugin, kind, record);
    });
  }
  int start() override {
    if (leadership) {
      // A candidate: the controller serves only while it leads, and
      // fences every action through etcd.
      if (int rc = leadership->start(); rc != BALLAST_OK) return rc;
    }
    if (int rc = Controller::create(*host, options, leadership.get(), &controller); rc != BALLAST_OK) return rc;
    if (int rc = controller->start(); rc != BALLAST_OK) return rc;
    serving.store(controller.get());
    return BALLAST_OK;
  }
  void stop() override {
    if (controller) controller->stop();
    if (leadership) leadership->stop();
  }
  nlohmann::json counters() const override {
    nlohmann::json j = controller ? controller->counters() : nlohmann::json::object();
    if (leadership) j.update(leadership->counters());
    return j;
  }
};

}  // namespace

int Role::from_config(const nlohmann::json& config, const std::string& base_dir, Host& host,
                      std::unique_ptr<Role>* out) {
  out->reset();
  const nlohmann::json* table = config_lookup(config, "cluster");
  if (table == nullptr) return BALLAST_OK;
  if (!table->is_object()) return fail(BALLAST_EINVAL, "config field 'cluster': expected a table");
  const nlohmann::json* role = config_lookup(config, "role");
  if (role == nullptr || !role->is_string())
    return fail(BALLAST_EINVAL, "config field 'role': a cluster table needs role = \"agent\" or \"controller\"");
  Reader r{*table, base_dir};
  if (*role == "agent") {
    AgentOptions o;
    o.node = host.node();
    TRY(common(r, &o.tls, &o.heartbeat_ms, &o.silent_after_ms));
    TRY(r.strings("controller", &o.controllers));
    if (o.controllers.empty()) return fail(BALLAST_EINVAL, "config field 'cluster.controller': required for an agent");
    o.spool.dir = "spool";
    TRY(r.string("spool.dir", &o.spool.dir, true));
    if (fs::path(o.spool.dir).is_relative()) o.spool.dir = (fs::path(base_dir) / o.spool.dir).string();
    double max_mb = static_cast<double>(o.spool.max_bytes >> 20);
    TRY(r.number("spool.max_mb", 1, 1 << 20, &max_mb));
    o.spool.max_bytes = static_cast<uint64_t>(max_mb * (1 << 20));
    o.spool.segment_bytes = std::min<uint64_t>(o.spool.segment_bytes, std::max<uint64_t>(o.spool.max_bytes / 8, 4096));
    TRY(r.boolean("spool.durable", &o.spool.durable));
    TRY(r.strings("forward", &o.forward));
    auto role_out = std::make_unique<AgentRole>();
    TRY(Agent::create(host, std::move(o), &role_out->agent));
    *out = std::move(role_out);
    return BALLAST_OK;
  }
  auto c = std::make_unique<ControllerRole>();
  c->host = &host;
  ControllerOptions& o = c->options;
  TRY(common(r, &o.tls, &o.heartbeat_ms, &o.silent_after_ms));
  TRY(r.string("listen", &o.listen));
  o.ingest_journal = "ingest.journal";
  TRY(r.string("ingest_journal", &o.ingest_journal, true));
  if (fs::path(o.ingest_journal).is_relative()) o.ingest_journal = (fs::path(base_dir) / o.ingest_journal).string();
  TRY(r.boolean("durable", &o.durable));
  double max_connections = o.max_connections, handshake_ms = o.handshake_timeout_ms;
  TRY(r.number("max_connections", 1, 1000000, &max_connections));
  TRY(r.number("handshake_timeout_ms", 100, 600000, &handshake_ms));
  o.max_connections = static_cast<int>(max_connections);
  o.handshake_timeout_ms = static_cast<int>(handshake_ms);
  if (r.at("etcd") != nullptr) {
    EtcdOptions& e = c->etcd;
    e.name = host.node();
    TRY(r.string("etcd.endpoint", &e.endpoint));
    TRY(r.string("etcd.job", &e.job));
    TRY(r.string("etcd.name", &e.name));
    double lease = e.lease_s;
    TRY(r.number("etcd.lease_s", 1, 600, &lease));
    TRY(r.string("etcd.tls.ca", &e.tls.ca, true));
    TRY(r.string("etcd.tls.cert", &e.tls.cert, true));
    TRY(r.string("etcd.tls.key", &e.tls.key, true));
    if (e.tls.cert.empty() != e.tls.key.empty())
      return fail(BALLAST_EINVAL, "config field 'cluster.etcd.tls': cert and key go together");
    e.lease_s = static_cast<int>(lease);
    if (e.endpoint.empty()) return fail(BALLAST_EINVAL, "config field 'cluster.etcd.endpoint': required");
    e.value = o.listen;
    TRY(EtcdLeadership::create(host, e, &c->leadership));
    c->install_fence();
  }
  *out = std::move(c);
  return BALLAST_OK;
}

}  // namespace ballast::cluster
