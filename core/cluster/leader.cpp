#include "leader.hpp"

#include "error.hpp"
#include "host.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>

namespace ballast::cluster {

namespace {

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A record of the action log: an agent's action ({"node","event"}) or a
// plugin's fence_action ({"node","plugin","kind","record","term"}); null
// with *why when it is neither (or larger than kMaxLogRecordBytes, a
// snapshot than kMaxSnapshotBytes).
nlohmann::json parse_logged(const std::string& value, std::string* why) {
  const auto too_large = [&](size_t bound) {
    *why = std::to_string(value.size()) + " bytes, more than " + std::to_string(bound);
    return nullptr;
  };
  if (value.size() > EtcdLeadership::kMaxSnapshotBytes) return too_large(EtcdLeadership::kMaxSnapshotBytes);
  nlohmann::json j = nlohmann::json::parse(value, nullptr, false);
  if (!j.is_object()) {
    *why = "not a JSON object";
    return nullptr;
  }
  auto text = [&](const char* field) { return j.contains(field) && j[field].is_string(); };
  if (!text("node")) {
    *why = "field 'node' is missing or not a string";
    return nullptr;
  }
  if (j.contains("event")) {
    if (value.size() > EtcdLeadership::kMaxLogRecordBytes) return too_large(EtcdLeadership::kMaxLogRecordBytes);
    return j;
  }
  for (const char* field : {"plugin", "kind"})
    if (!text(field)) {
      *why = std::string("field '") + field + "' is missing or not a string";
      return nullptr;
    }
  if (!j.contains("record") || !j["record"].is_object()) {
    *why = "field 'record' is missing or not an object";
    return nullptr;
  }
  if (!j.contains("term") || !j["term"].is_number_unsigned()) {
    *why = "field 'term' is missing or not a number";
    return nullptr;
  }
  if (value.size() > EtcdLeadership::kMaxLogRecordBytes && !Host::snapshot_kind(j["kind"].get<std::string>()))
    return too_large(EtcdLeadership::kMaxLogRecordBytes);
  return j;
}

}  // namespace

int EtcdLeadership::create(Host& host, EtcdOptions options, std::unique_ptr<EtcdLeadership>* out) {
  auto l = std::unique_ptr<EtcdLeadership>(new EtcdLeadership(host));
  l->options_ = std::move(options);
  l->client_ = std::make_unique<Etcd>(l->options_.endpoint, l->options_.tls);
  *out = std::move(l);
  return BALLAST_OK;
}

EtcdLeadership::~EtcdLeadership() { stop(); }

int EtcdLeadership::start() {
  int64_t lease = 0;
  {
    std::lock_guard lock(mutex_);
    if (int rc = client_->grant_lease(options_.lease_s, &lease); rc != BALLAST_OK)
      return fail(rc, std::string("cluster.etcd: ") + last_error());
  }
  lease_.store(lease);
  campaign_ = std::thread([this] { campaign_loop(); });
  keepalive_ = std::thread([this] { keepalive_loop(); });
  host_.log(BALLAST_LOG_INFO, "cluster", "candidate " + options_.name + " campaigning for " + prefix() + "leader");
  return BALLAST_OK;
}

void EtcdLeadership::stop() {
  if (quit_.exchange(true)) return;
  if (campaign_.joinable()) campaign_.join();
  if (keepalive_.joinable()) keepalive_.join();
  // Resign, so that a candidate takes over at once rather than after the lease.
  if (leader_.exchange(false)) {
    std::lock_guard lock(mutex_);
    client_->resign(prefix() + "leader", key_, revision_.load(), lease_.load());
    host_.log(BALLAST_LOG_INFO, "cluster", options_.name + " resigned");
  }
}

void EtcdLeadership::campaign_loop() {
  Etcd etcd(options_.endpoint, options_.tls);
  while (!quit_.load()) {
    if (leader_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    std::string key;
    int64_t rev = 0;
    int64_t lease = lease_.load();
    if (etcd.campaign(prefix() + "leader", lease, options_.value, &key, &rev, &quit_) != BALLAST_OK) {
      if (!quit_.load()) {
        etcd_errors_.fetch_add(1);
        host_.log(BALLAST_LOG_WARN, "cluster", std::string("campaign: ") + last_error());
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
      continue;
    }
    if (lease != lease_.load()) continue;  // the lease lapsed while campaigning: campaign again
    // What the previous leaders left: the cursors, the newest
    // kMaxLogRecords agents' actions, and of each plugin's records (at most
    // kMaxLogPlugins plugins) the newest kMaxLogRecords: bounded, each part on
    // its own, so that no plugin's flood hides another's records. Older ones
    // are named in a warning, not read. A plugin's part begins at its newest
    // snapshot: a snapshot deleted what came before it.
    std::vector<std::pair<std::string, std::string>> cursor_kvs, action_kvs, record_kvs;
    int64_t logged = 0;
    bool records_complete = true;
    if (etcd.range_prefix(prefix() + "cursor/", &cursor_kvs) != BALLAST_OK ||
        etcd.range_prefix(prefix() + "actions/", &action_kvs, kMaxLogRecords, &logged) != BALLAST_OK ||
        read_records(etcd, &record_kvs, &records_complete) != BALLAST_OK) {
      etcd_errors_.fetch_add(1);
      host_.log(BALLAST_LOG_WARN, "cluster", std::string("reading the previous term: ") + last_error());
      continue;
    }
    if (logged > int64_t(action_kvs.size()))
      host_.log(BALLAST_LOG_WARN, "cluster",
                "the action log " + prefix() + "actions/ holds " + std::to_string(logged) + " records: the " +
                    std::to_string(logged - int64_t(action_kvs.size())) + " oldest are not read (at most " +
                    std::to_string(kMaxLogRecords) + ")");
    const bool complete = logged <= int64_t(action_kvs.size()) && records_complete;
    const size_t read = action_kvs.size() + record_kvs.size();
    action_kvs.insert(action_kvs.end(), std::make_move_iterator(record_kvs.begin()),
                      std::make_move_iterator(record_kvs.end()));
    nlohmann::json own = nlohmann::json::array();  // records of plugins' fence_action, for the plugins
    size_t malformed = 0;
    {
      std::lock_guard lock(mutex_);
      key_ = key;
      cursors_.clear();
      for (auto& [k, v] : cursor_kvs) cursors_[k.substr(prefix().size() + 7)] = std::strtoull(v.c_str(), nullptr, 10);
      actions_.clear();
      for (auto& [k, v] : action_kvs) {
        const uint64_t id = std::strtoull(k.substr(k.rfind('/') + 1).c_str(), nullptr, 10);
        std::string why;
        nlohmann::json j = parse_logged(v, &why);
        if (j.is_null()) {
          ++malformed;
          host_.log(BALLAST_LOG_WARN, "cluster", "action log: " + k + " is skipped: " + why);
        } else if (j.contains("event")) {
          actions_.push_back({j["node"].get<std::string>(), id, j["event"].dump()});
        } else {
          j["id"] = id;
          own.push_back(std::move(j));
        }
      }
    }
    // Every plugin's records, in the order they were written (ids grow).
    std::sort(own.begin(), own.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return a["id"].get<uint64_t>() < b["id"].get<uint64_t>();
    });
    const size_t pending = read - own.size() - malformed;
    revision_.store(rev);
    elected_at_ms_.store(wall_ms());
    terms_.fetch_add(1);
    host_.log(BALLAST_LOG_INFO, "cluster",
              options_.name + " is the leader (revision " + std::to_string(rev) + "): read " +
                  std::to_string(cursor_kvs.size()) + " cursor(s), " + std::to_string(pending) +
                  " pending action(s) and " + std::to_string(own.size()) +
                  " record(s) of earlier leaders' own actions" +
                  (malformed ? ", skipped " + std::to_string(malformed) + " malformed record(s)" : ""));
    // The cursors this term starts from: what the earlier terms applied.
    nlohmann::json cursors = nlohmann::json::object();
    {
      std::lock_guard lock(mutex_);
      for (auto& [node, seq] : cursors_) cursors[node] = seq;
    }
    // The earlier terms' records of what plugins did outside this process
    // (a successor's executor takes over its predecessor's job from them).
    nlohmann::json j = {
        {"leader", options_.name},       {"revision", rev},       {"elected_at_ms", elected_at_ms_.load()},
        {"cursors", std::move(cursors)}, {"log", std::move(own)}, {"log_complete", complete}};
    // Published before this candidate acts as the leader: a plugin's inline
    // handler has the log before any of its fence_action calls is allowed.
    host_.publish_json("controller.leader", j.dump(), "cluster");
    leader_.store(true);
  }
}

// Every plugin's part of the log (records/<plugin>/), one after another:
// the first key after the last part read names the next plugin.
int EtcdLeadership::read_records(Etcd& etcd, std::vector<std::pair<std::string, std::string>>* out, bool* complete) {
  const std::string records = prefix() + "records/", end = Etcd::prefix_end(records);
  std::string from = records, first;
  out->clear();
  *complete = true;
  for (size_t plugins = 0;; ++plugins) {
    if (int rc = etcd.first_key(from, end, &first); rc != BALLAST_OK) return rc;
    if (first.empty()) return BALLAST_OK;
    if (plugins == kMaxLogPlugins) {
      host_.log(BALLAST_LOG_WARN, "cluster",
                "the action log " + records + " holds the records of more than " + std::to_string(kMaxLogPlugins) +
                    " plugins: those from " + first + " on are not read");
      *complete = false;
      return BALLAST_OK;
    }
    const size_t slash = first.find('/', records.size());
    if (slash == std::string::npos) {  // records/<name> with no id: not a record
      host_.log(BALLAST_LOG_WARN, "cluster", "action log: " + first + " is skipped: not records/<plugin>/<id>");
      from = first + '\0';
      continue;
    }
    const std::string part = first.substr(0, slash + 1);
    std::vector<std::pair<std::string, std::string>> kvs;
    int64_t total = 0;
    if (int rc = etcd.range_prefix(part, &kvs, kMaxLogRecords, &total); rc != BALLAST_OK) return rc;
    if (total > int64_t(kvs.size())) {
      host_.log(BALLAST_LOG_WARN, "cluster",
                "the action log " + part + " holds " + std::to_string(total) + " records: the " +
                    std::to_string(total - int64_t(kvs.size())) + " oldest are not read (at most " +
                    std::to_string(kMaxLogRecords) + "; does the plugin write snapshots?)");
      *complete = false;
    }
    out->insert(out->end(), std::make_move_iterator(kvs.begin()), std::make_move_iterator(kvs.end()));
    from = Etcd::prefix_end(part);
  }
}

void EtcdLeadership::keepalive_loop() {
  Etcd etcd(options_.endpoint, options_.tls);
  const int period_ms = std::max(200, options_.lease_s * 1000 / 3);
  while (!quit_.load()) {
    for (int waited = 0; waited < period_ms && !quit_.load(); waited += 50)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (quit_.load()) break;
    int64_t ttl = 0;
    if (etcd.keepalive(lease_.load(), &ttl) == BALLAST_OK && ttl > 0) continue;
    // Lapsed (or etcd unreachable past its TTL): step down, campaign anew.
    etcd_errors_.fetch_add(1);
    deposed("lease " + std::to_string(lease_.load()) + " lapsed");
    int64_t lease = 0;
    if (etcd.grant_lease(options_.lease_s, &lease) == BALLAST_OK) lease_.store(lease);
  }
}

void EtcdLeadership::deposed(const std::string& why) {
  if (leader_.exchange(false)) {
    fenced_off_.fetch_add(1);
    host_.log(BALLAST_LOG_WARN, "cluster", options_.name + " is no longer the leader: " + why);
  }
}

int EtcdLeadership::fenced(const std::vector<std::pair<std::string, std::string>>& puts,
                           const std::vector<Etcd::Delete>& deletes) {
  if (!leader_.load()) return fail(BALLAST_ESTATE, options_.name + " is not the leader");
  bool ok = false;
  std::lock_guard lock(mutex_);
  // A transport error leaves it unknown whether etcd applied the transaction;
  // the writes are idempotent, so they are tried again while this term lasts.
  for (int attempt = 0;; ++attempt) {
    int rc = client_->put_if(key_, revision_.load(), puts, deletes, &ok);
    if (rc == BALLAST_OK) break;
    etcd_errors_.fetch_add(1);
    if (attempt == 2 || !leader_.load()) return rc;
  }
  if (!ok) {
    deposed("a fenced transaction failed: the leader key is gone");
    return fail(BALLAST_ESTATE, options_.name + " was deposed");
  }
  return BALLAST_OK;
}

namespace {

std::string id_key(uint64_t id) {
  char name[32];
  std::snprintf(name, sizeof name, "%020" PRIu64, id);
  return name;
}

}  // namespace

int EtcdLeadership::record_action(const std::string& node, uint64_t id, const std::string& action_json) {
  nlohmann::json j = {{"node", node}, {"event", nlohmann::json::parse(action_json, nullptr, false)}};
  return fenced({{prefix() + "actions/" + id_key(id), j.dump()}}, {});
}

int EtcdLeadership::record_own_action(const std::string& plugin, uint64_t id, const std::string& record_json,
                                      bool snapshot) {
  const std::string part = prefix() + "records/" + plugin + "/", key = part + id_key(id);
  // Refused here rather than skipped by a successor's read.
  const size_t bound = snapshot ? kMaxSnapshotBytes : kMaxLogRecordBytes;
  if (record_json.size() > bound)
    return fail(BALLAST_EINVAL, "a record of plugin " + plugin + " of " + std::to_string(record_json.size()) +
                                    " bytes, more than " + std::to_string(bound) +
                                    (snapshot ? "" : " (a .snapshot record may hold up to 1 MiB)"));
  // A snapshot and the deletion of what it replaces are one transaction: a
  // crash or a deposition leaves both or neither.
  std::vector<Etcd::Delete> older;
  if (snapshot) older.push_back({part, key});
  int rc = fenced({{key, record_json}}, older);
  if (rc == BALLAST_OK && snapshot) snapshots_.fetch_add(1);
  return rc;
}

int EtcdLeadership::commit(const std::map<std::string, uint64_t>& cursors, const std::vector<uint64_t>& acknowledged) {
  // One transaction, so that a term's cursors move together or not at all.
  if (cursors.size() + acknowledged.size() > kMaxOpsPerCommit)
    return fail(BALLAST_EINVAL,
                "commit: " + std::to_string(cursors.size() + acknowledged.size()) + " operations in one transaction");
  std::vector<std::pair<std::string, std::string>> puts;
  for (const auto& [node, seq] : cursors) puts.emplace_back(prefix() + "cursor/" + node, std::to_string(seq));
  std::vector<Etcd::Delete> deletes;
  for (uint64_t id : acknowledged) deletes.push_back({prefix() + "actions/" + id_key(id), ""});
  return fenced(puts, deletes);
}

std::map<std::string, uint64_t> EtcdLeadership::cursors() const {
  std::lock_guard lock(mutex_);
  return cursors_;
}

std::vector<Leadership::LoggedAction> EtcdLeadership::logged_actions() const {
  std::lock_guard lock(mutex_);
  return actions_;
}

nlohmann::json EtcdLeadership::counters() const {
  return {{"cluster.leader", leader_.load() ? 1 : 0},   {"cluster.terms", terms_.load()},
          {"cluster.deposed", fenced_off_.load()},      {"cluster.etcd_errors", etcd_errors_.load()},
          {"cluster.log_snapshots", snapshots_.load()}, {"cluster.elected_at_ms", elected_at_ms_.load()}};
}

}  // namespace ballast::cluster
