// Out-of-band exchange of worker addresses over TCP: rank 0 listens at
// MASTER_ADDR:MASTER_PORT, every other rank connects and sends its address;
// rank 0 checks the world (sizes, duplicates) and sends everyone the table.
//
// The port is open to whoever can reach it, so rank 0 trusts a hello only
// when it is authenticated: rank 0 sends each connection a fresh nonce, the
// rank answers with an HMAC-SHA256 over the nonce and its hello keyed by the
// job's secret (BALLAST_BOOTSTRAP_SECRET, handed to the ranks by the
// launcher), and rank 0's answer carries an HMAC over the rank's own nonce.
// Without a secret, a job whose MASTER_ADDR is loopback accepts connections
// from processes of the same user only (the peer socket's owner); any other
// job refuses to start. Connections are read concurrently, each with its
// own deadline; one that is malformed, unauthenticated or slow is dropped
// and counted, never trusted and never fatal to the job.
#pragma once

#include <array>
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
  uint64_t job_id = 0;          // random, chosen by rank 0: equal on every rank
  std::vector<PeerInfo> peers;  // by rank
  int dropped = 0;              // rank 0: connections dropped (malformed, unauthenticated, slow)
};

// The environment variable that carries the job's secret.
inline constexpr const char* kBootstrapSecretEnv = "BALLAST_BOOTSTRAP_SECRET";

// Bounds on what a hello may carry, checked before anything else sees it.
inline constexpr size_t kMaxHostBytes = 255;
inline constexpr size_t kMaxAddressBytes = 16384;

// Blocks until every rank joined or deadline_ns (CLOCK_MONOTONIC) passed.
// The secret comes from BALLAST_BOOTSTRAP_SECRET. Returns 0 or a negative
// BALLAST_E* with *err naming the reason.
int bootstrap_exchange(int rank, int nranks, const std::string& master_addr, int master_port, const PeerInfo& self,
                       int64_t deadline_ns, BootstrapResult* out, std::string* err);

// The same with the secret given (empty: none, see above).
int bootstrap_exchange_with_secret(int rank, int nranks, const std::string& master_addr, int master_port,
                                   const std::string& secret, const PeerInfo& self, int64_t deadline_ns,
                                   BootstrapResult* out, std::string* err);

// The name of the local network interface through which MASTER_ADDR is
// reached ("lo" for a local job), or "" with *err set.
std::string interface_towards(const std::string& master_addr, std::string* err);

int64_t monotonic_ns();

// ---- the wire, for tests and fuzz targets ----

// A hello's body once rank 0 checked its MAC: what a connection hands it.
struct HelloBody {
  uint32_t version = 0;
  int32_t rank = 0;
  int32_t world = 0;
  PeerInfo peer;
  std::array<uint8_t, 16> nonce{};  // the rank's, for rank 0's answer
};

// Decode a hello body. False when a field is out of bounds (see kMax*), the
// peer has no pid or address, or bytes are left over; the fields read so far
// are set either way (the version first, to report mixed versions).
bool decode_hello(const uint8_t* body, size_t size, HelloBody* out);

// Decode the table rank 0 sends: the job id and nranks peers. False when
// malformed.
bool decode_table(const uint8_t* body, size_t size, int nranks, uint64_t* job_id, std::vector<PeerInfo>* peers);

}  // namespace ballast::comm
