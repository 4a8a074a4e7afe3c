// The cluster roles of `ballast run`: when the config has a `cluster` table,
// role = "agent" forwards this node's events to a controller, role =
// "controller" accepts agents (optionally as one of several candidates
// elected through etcd). Without a `cluster` table the host runs alone (the
// embedded default). Configuration (paths relative to the config file):
//
//   cluster = {
//     tls = { ca = "ca.crt", cert = "node.crt", key = "node.key",
//             server_name = "ballast-controller" },
//     heartbeat_ms = 1000, silent_after_ms = 5000,
//     -- agent
//     controller = "10.0.0.1:7700",          -- or a list of candidates
//     spool = { dir = "spool", max_mb = 256, durable = false },
//     forward = { "metric.*", "step.*", ... },
//     -- controller
//     listen = "127.0.0.1:7700",             -- loopback unless configured
//     ingest_journal = "ingest.journal", durable = true,
//     max_connections = 16384, handshake_timeout_ms = 5000,
//     etcd = { endpoint = "http://127.0.0.1:2379", job = "job1", name = "ctl-a", lease_s = 5 },
//   }
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace ballast {
class Host;
}

namespace ballast::cluster {

class Role {
 public:
  virtual ~Role() = default;
  // Null in *out when the config asks for no cluster role. Status; the
  // message names the field.
  static int from_config(const nlohmann::json& config, const std::string& base_dir, Host& host,
                         std::unique_ptr<Role>* out);
  virtual int start() = 0;
  virtual void stop() = 0;
  virtual nlohmann::json counters() const = 0;
};

}  // namespace ballast::cluster
