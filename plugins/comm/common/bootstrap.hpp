// Out-of-band exchange of worker addresses over TCP: rank 0 listens at
// MASTER_ADDR:MASTER_PORT, every other rank connects and sends its address;
// rank 0 checks the world (sizes, duplicates) and sends everyone the table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ballast::comm {

struct PeerInfo {
  int32_t pid = 0;
  std::string host;
  std::vector<uint8_t> address;  // the UCX worker address
};

struct BootstrapResult {
  uint64_t job_id = 0;  // random, chosen by rank 0: equal on every rank
  std::vector<PeerInfo> peers;  // by rank
};

// Blocks until every rank joined or deadline_ns (CLOCK_MONOTONIC) passed.
// Returns 0 or a negative BALLAST_E* with *err naming the reason.
int bootstrap_exchange(int rank, int nranks, const std::string& master_addr, int master_port,
                       const PeerInfo& self, int64_t deadline_ns, BootstrapResult* out, std::string* err);

int64_t monotonic_ns();

}  // namespace ballast::comm
