#include "etcd.hpp"

#include "error.hpp"

#include <ballast/status.h>

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

namespace ballast::cluster {

namespace {

std::once_flag g_curl_init;

size_t on_data(char* data, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::string*>(user);
  if (out->size() + size * n > (16u << 20)) return 0;  // bounded reply
  out->append(data, size * n);
  return size * n;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* abort = static_cast<const std::atomic<bool>*>(user);
  return abort != nullptr && abort->load() ? 1 : 0;
}

int64_t as_int(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return 0;
  if (it->is_string()) return std::strtoll(it->get<std::string>().c_str(), nullptr, 10);
  if (it->is_number_integer()) return it->get<int64_t>();
  return 0;
}

}  // namespace

// The end of a prefix range: the prefix with its last byte incremented.
std::string Etcd::prefix_end(std::string p) {
  while (!p.empty()) {
    unsigned char c = static_cast<unsigned char>(p.back());
    if (c < 0xff) {
      p.back() = static_cast<char>(c + 1);
      return p;
    }
    p.pop_back();
  }
  return std::string(1, '\0');
}

std::string Etcd::b64(const std::string& s) {
  std::string out(4 * ((s.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string Etcd::unb64(const std::string& s) {
  std::string out(3 * (s.size() / 4) + 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0) return {};
  size_t pad = 0;
  for (size_t i = s.size(); i > 0 && s[i - 1] == '='; --i) ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

Etcd::Etcd(std::string endpoint, EtcdTls tls) : endpoint_(std::move(endpoint)), tls_(std::move(tls)) {
  std::call_once(g_curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
}

Etcd::~Etcd() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

int Etcd::call(const std::string& path, const nlohmann::json& body, nlohmann::json* reply, long timeout_ms,
               const std::atomic<bool>* abort) {
  auto* c = static_cast<CURL*>(curl_);
  if (c == nullptr) return fail(BALLAST_EIO, "etcd: curl_easy_init failed");
  std::string url = endpoint_ + path, text = body.dump(), answer;
  curl_easy_reset(c);
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, text.c_str());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(text.size()));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &answer);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  if (!tls_.ca.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, tls_.ca.c_str());
  if (!tls_.cert.empty()) curl_easy_setopt(c, CURLOPT_SSLCERT, tls_.cert.c_str());
  if (!tls_.key.empty()) curl_easy_setopt(c, CURLOPT_SSLKEY, tls_.key.c_str());
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, const_cast<std::atomic<bool>*>(abort));
  CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK) return fail(BALLAST_EIO, "etcd " + url + ": " + curl_easy_strerror(rc));
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  *reply = nlohmann::json::parse(answer, nullptr, false);
  if (reply->is_discarded())
    return fail(BALLAST_EFORMAT, "etcd " + url + ": reply is not JSON: " + answer.substr(0, 200));
  if (status != 200 || reply->contains("error"))
    return fail(BALLAST_EIO, "etcd " + url + ": HTTP " + std::to_string(status) + ": " +
                                 reply->value("error", reply->value("message", answer.substr(0, 200))));
  return BALLAST_OK;
}

int Etcd::grant_lease(int ttl_s, int64_t* lease) {
  nlohmann::json r;
  if (int rc = call("/v3/lease/grant", {{"TTL", ttl_s}}, &r); rc != BALLAST_OK) return rc;
  *lease = as_int(r, "ID");
  return *lease != 0 ? BALLAST_OK : fail(BALLAST_EFORMAT, "etcd lease grant: no ID in the reply");
}

int Etcd::keepalive(int64_t lease, int64_t* ttl) {
  nlohmann::json r;
  if (int rc = call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}, &r); rc != BALLAST_OK) return rc;
  *ttl = r.contains("result") ? as_int(r["result"], "TTL") : 0;
  return BALLAST_OK;
}

int Etcd::campaign(const std::string& election, int64_t lease, const std::string& value, std::string* key,
                   int64_t* revision, const std::atomic<bool>* abort) {
  nlohmann::json r;
  nlohmann::json body = {{"name", b64(election)}, {"lease", std::to_string(lease)}, {"value", b64(value)}};
  if (int rc = call("/v3/election/campaign", body, &r, 0, abort); rc != BALLAST_OK) return rc;
  if (!r.contains("leader")) return fail(BALLAST_EFORMAT, "etcd campaign: no leader in the reply");
  *key = unb64(r["leader"].value("key", ""));
  *revision = as_int(r["leader"], "rev");
  return BALLAST_OK;
}

int Etcd::resign(const std::string& election, const std::string& key, int64_t revision, int64_t lease) {
  nlohmann::json r;
  nlohmann::json body = {{"leader",
                          {{"name", b64(election)},
                           {"key", b64(key)},
                           {"rev", std::to_string(revision)},
                           {"lease", std::to_string(lease)}}}};
  return call("/v3/election/resign", body, &r);
}

int Etcd::put_if(const std::string& guard, int64_t revision,
                 const std::vector<std::pair<std::string, std::string>>& puts, const std::vector<Delete>& deletes,
                 bool* succeeded) {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& [k, v] : puts) ops.push_back({{"request_put", {{"key", b64(k)}, {"value", b64(v)}}}});
  for (const auto& d : deletes) {
    nlohmann::json range = {{"key", b64(d.key)}};
    if (!d.range_end.empty()) range["range_end"] = b64(d.range_end);
    ops.push_back({{"request_delete_range", std::move(range)}});
  }
  nlohmann::json body = {{"compare",
                          {{{"key", b64(guard)},
                            {"target", "CREATE"},
                            {"result", "EQUAL"},
                            {"create_revision", std::to_string(revision)}}}},
                         {"success", ops}};
  nlohmann::json r;
  if (int rc = call("/v3/kv/txn", body, &r); rc != BALLAST_OK) return rc;
  *succeeded = r.value("succeeded", false);
  return BALLAST_OK;
}

int Etcd::first_key(const std::string& from, const std::string& end, std::string* key) {
  nlohmann::json body = {{"key", b64(from)}, {"range_end", b64(end)}, {"limit", "1"}, {"keys_only", true}};
  nlohmann::json r;
  if (int rc = call("/v3/kv/range", body, &r); rc != BALLAST_OK) return rc;
  key->clear();
  if (r.contains("kvs") && r["kvs"].is_array() && !r["kvs"].empty()) {
    const auto& kv = r["kvs"][0];
    if (!kv.is_object() || !kv.contains("key") || !kv["key"].is_string())
      return fail(BALLAST_EFORMAT, "etcd range from " + from + ": a key-value without a key in the reply");
    *key = unb64(kv["key"].get<std::string>());
  }
  return BALLAST_OK;
}

int Etcd::range_prefix(const std::string& prefix, std::vector<std::pair<std::string, std::string>>* out, size_t newest,
                       int64_t* total) {
  nlohmann::json body = {{"key", b64(prefix)}, {"range_end", b64(prefix_end(prefix))}};
  if (newest > 0) {
    body["limit"] = std::to_string(newest);
    body["sort_order"] = "DESCEND";
    body["sort_target"] = "KEY";
  }
  nlohmann::json r;
  if (int rc = call("/v3/kv/range", body, &r); rc != BALLAST_OK) return rc;
  out->clear();
  if (r.contains("kvs") && r["kvs"].is_array())
    for (const auto& kv : r["kvs"]) {
      if (!kv.is_object() || !kv.contains("key") || !kv["key"].is_string())
        return fail(BALLAST_EFORMAT, "etcd range " + prefix + ": a key-value without a key in the reply");
      const auto value = kv.find("value");
      out->emplace_back(unb64(kv["key"].get<std::string>()),
                        value != kv.end() && value->is_string() ? unb64(value->get<std::string>()) : std::string());
    }
  if (newest > 0) std::reverse(out->begin(), out->end());
  if (total != nullptr) *total = std::max<int64_t>(as_int(r, "count"), int64_t(out->size()));
  return BALLAST_OK;
}

}  // namespace ballast::cluster
