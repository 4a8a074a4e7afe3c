// Certificates for many emulated nodes, made in process with OpenSSL (one
// key shared by the nodes, a certificate each): tools/engines/make-certs
// spawns openssl three times a node, too slow for 1,000 nodes.
#pragma once

#include <string>
#include <vector>

namespace bench_cluster {

// DIR/ca.crt, DIR/controller.{crt,key}, DIR/<node>.crt and DIR/node.key.
bool make_certs(const std::string& dir, const std::vector<std::string>& nodes, std::string* error);

}  // namespace bench_cluster
