// A small client of etcd 3.4's JSON gateway (/v3/...), over libcurl: the
// calls controller election and fencing need. Keys and values are plain
// strings here; base64 (the gateway's encoding) stays inside.
// Thread-safety: one Etcd per thread (each holds a curl handle).
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace ballast::cluster {

// Client TLS for an https:// endpoint: the CA that signed etcd's
// certificate, and this client's certificate and key (etcd's
// --client-cert-auth). Empty: plain HTTP, or https with the system's CAs.
struct EtcdTls {
  std::string ca, cert, key;
};

class Etcd {
 public:
  explicit Etcd(std::string endpoint, EtcdTls tls = {});
  ~Etcd();
  Etcd(const Etcd&) = delete;
  Etcd& operator=(const Etcd&) = delete;

  // POST `path` with `body`; the reply in *reply. Status; the message names
  // the endpoint, the path and etcd's error. timeout_ms 0 = none (until
  // `abort` becomes true, checked every ~100 ms).
  int call(const std::string& path, const nlohmann::json& body, nlohmann::json* reply, long timeout_ms = 3000,
           const std::atomic<bool>* abort = nullptr);

  int grant_lease(int ttl_s, int64_t* lease);
  // Renew; *ttl = the lease's remaining TTL (0 = expired).
  int keepalive(int64_t lease, int64_t* ttl);
  // Block until this candidate leads `election`; *key and *revision of its
  // leader key.
  int campaign(const std::string& election, int64_t lease, const std::string& value, std::string* key,
               int64_t* revision, const std::atomic<bool>* abort);
  int resign(const std::string& election, const std::string& key, int64_t revision, int64_t lease);
  // A key to delete in put_if: the key alone, or with `range_end` every key
  // in [key, range_end).
  struct Delete {
    std::string key, range_end;
  };
  // Put key=value and delete, in one transaction, only if `guard` still has
  // create revision `revision`. *succeeded false when the guard failed
  // (deposed): nothing was written nor deleted.
  int put_if(const std::string& guard, int64_t revision, const std::vector<std::pair<std::string, std::string>>& puts,
             const std::vector<Delete>& deletes, bool* succeeded);
  // Every key under `prefix`, with values, in key order. With `newest` > 0,
  // only the last `newest` keys (still in key order), and *total (when
  // given) the number of keys under the prefix.
  int range_prefix(const std::string& prefix, std::vector<std::pair<std::string, std::string>>* out, size_t newest = 0,
                   int64_t* total = nullptr);

  // The first key in [from, end) in *key ("" when none).
  int first_key(const std::string& from, const std::string& end, std::string* key);

  // The end of the range of every key that begins with `prefix`.
  static std::string prefix_end(std::string prefix);
  static std::string b64(const std::string& s);
  static std::string unb64(const std::string& s);

 private:
  std::string endpoint_;
  EtcdTls tls_;
  void* curl_ = nullptr;
};

}  // namespace ballast::cluster
