// A world: rank and size from the config or torchrun's environment, UCX
// tuned for the transports allowed, worker addresses exchanged over the TCP
// bootstrap, an endpoint per peer, and the trace ring.
#include "engine.hpp"

#include "cpus.hpp"

#include <sched.h>
#include <unistd.h>

namespace ballast::comm {

namespace {

int64_t env_i64(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return end && *end == '\0' ? int64_t(x) : dflt;
}

// Whether UCX_TLS lets UCX load its tcp transport: unset, "all", a list
// naming tcp, or an exclusion list ("^...") that does not name it.
bool may_use_tcp(const char* tls) {
  if (!tls || !*tls) return true;
  bool named = false;
  const bool exclude = tls[0] == '^';
  for (const char* p = exclude ? tls + 1 : tls; *p;) {
    const char* e = std::strchr(p, ',');
    const std::string t(p, e ? size_t(e - p) : std::strlen(p));
    if (t == "tcp" || (!exclude && t == "all")) named = true;
    p = e ? e + 1 : p + t.size();
  }
  return exclude ? !named : named;
}

// Whether UCX_TLS names tcp and no other transport but self.
bool tcp_only(const char* tls) {
  if (!tls || !*tls || tls[0] == '^') return false;
  bool tcp = false;
  for (const char* p = tls; *p;) {
    const char* e = std::strchr(p, ',');
    const std::string t(p, e ? size_t(e - p) : std::strlen(p));
    if (t == "tcp")
      tcp = true;
    else if (t != "self")
      return false;
    p = e ? e + 1 : p + t.size();
  }
  return tcp;
}

void ep_error(void* arg, ucp_ep_h, ucs_status_t status) { static_cast<PeerState*>(arg)->ep_status = status; }

// Where this rank is and whom it meets, from the config or torchrun's
// environment.
struct Placement {
  int rank = 0, nranks = 1;
  std::string master_addr;
  int master_port = 0;
  int64_t timeout_ns = 0, init_timeout_ns = 0;
};

int place(const ballast_comm_config* cfg, Placement* out, std::string* err) {
  auto str = [](const char* v, const char* env, const char* dflt) {
    if (v && *v) return std::string(v);
    const char* e = std::getenv(env);
    return std::string(e && *e ? e : dflt);
  };
  int rank = cfg && cfg->rank >= 0 ? cfg->rank : int(env_i64("RANK", -1));
  int nranks = cfg && cfg->nranks > 0 ? cfg->nranks : int(env_i64("WORLD_SIZE", 0));
  if (rank < 0 && nranks == 0) {
    rank = 0;
    nranks = 1;  // no launcher: a world of one
  }
  if (nranks <= 0 || nranks > 0xFFFF || rank < 0 || rank >= nranks) {
    *err = "invalid rank " + std::to_string(rank) + " for world size " + std::to_string(nranks) +
           " (RANK must be in [0, WORLD_SIZE), WORLD_SIZE in [1, 65535])";
    return BALLAST_EINVAL;
  }
  const int port = cfg && cfg->master_port > 0 ? cfg->master_port : int(env_i64("MASTER_PORT", 29500));
  if (port <= 0 || port > 65535) {
    *err = "invalid MASTER_PORT " + std::to_string(port);
    return BALLAST_EINVAL;
  }
  out->rank = rank;
  out->nranks = nranks;
  out->master_addr = str(cfg ? cfg->master_addr : nullptr, "MASTER_ADDR", "127.0.0.1");
  out->master_port = port;
  out->timeout_ns = cfg && cfg->timeout_ns > 0 ? cfg->timeout_ns : env_i64("BALLAST_COMM_TIMEOUT_MS", 300000) * 1000000;
  out->init_timeout_ns = cfg && cfg->init_timeout_ns > 0 ? cfg->init_timeout_ns : out->timeout_ns;
  return BALLAST_OK;
}

// The algorithm thresholds, each overridable by its BALLAST_COMM_* variable.
// README.md ("Measurements behind the defaults") has the measurements
// behind each default.
void tune(World* w, bool tcp) {
  // Over tcp alone a rendezvous costs a round trip both ranks must be
  // scheduled for, so fewer and larger chunks win.
  w->chunk_bytes = size_t(std::max<int64_t>(4096, env_i64("BALLAST_COMM_CHUNK_BYTES", tcp ? 1 << 20 : 256 << 10)));
  w->small_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_SMALL_BYTES", 16 << 10)));
  // Not over tcp alone, where each message costs system calls on both ends.
  w->direct_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_DIRECT_BYTES", tcp ? 0 : 1 << 10)));
  w->halving_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_HALVING_BYTES", 512 << 10)));
  // 2 ranks swap whole buffers instead of running the ring: over tcp alone
  // from 128 KiB to 1 MiB (each message costs system calls on both ends, a
  // rendezvous a round trip more), on one host up to 4 MiB (one copy each
  // way through the kernel, against the ring's 4 steps of waits). Between
  // hosts over other transports the ring keeps every size.
  w->tcp_only = tcp;
  w->pair_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_PAIR_BYTES", tcp ? 1 << 20 : 4 << 20)));
  w->pair_min_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_PAIR_MIN_BYTES", 128 << 10)));
  w->ring_direct_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_RING_DIRECT_BYTES", 4 << 20)));
}

// The UCX context and worker. *features says what ucp_init was asked for.
int open_ucx(World* w, const Placement& at, bool tcp, uint64_t* features, std::string* err) {
  // UCX's tcp transport listens on every network interface: a local job
  // (MASTER_ADDR loopback) keeps it to lo, a job over tcp alone to the
  // interface that reaches MASTER_ADDR. Other jobs keep every device (the
  // list would also hide InfiniBand ones). A user's UCX_NET_DEVICES wins.
  if (!std::getenv("UCX_NET_DEVICES") && may_use_tcp(std::getenv("UCX_TLS"))) {
    std::string ierr;
    const std::string dev = interface_towards(at.master_addr, &ierr);
    if (dev == "lo" || (tcp && !dev.empty())) setenv("UCX_NET_DEVICES", dev.c_str(), 0);
  }
  // tcp sockets with 4 MiB buffers from the start (the kernel caps them at
  // net.core.[wr]mem_max) instead of autotuned ones that start at 16 KiB.
  // Through the environment, not ucp_config_modify, which does not reach the
  // transports' settings in UCX 1.13; a value the user set is kept.
  if (may_use_tcp(std::getenv("UCX_TLS"))) {  // else UCX warns of unused variables
    setenv("UCX_TCP_SNDBUF", "4M", 0);
    setenv("UCX_TCP_RCVBUF", "4M", 0);
  }
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) {
    *err = "cannot read the UCX configuration (UCX_* environment variables)";
    return BALLAST_EIO;
  }
  // Messages below 64 KiB go eager, not by rendezvous (UCX's own threshold
  // is lower): a rendezvous costs a round trip of control messages, and over
  // tcp its zero-copy put is emulated with active messages. Over tcp alone,
  // every message under 512 KiB (or under a chunk, if smaller) goes eager;
  // full chunks keep the rendezvous. A user's UCX_RNDV_THRESH wins.
  if (!std::getenv("UCX_RNDV_THRESH"))
    ucp_config_modify(config, "RNDV_THRESH",
                      tcp ? std::to_string(std::min<size_t>(w->chunk_bytes, 512 << 10)).c_str() : "64K");
  // UCX 1.13's new protocols (UCX_PROTO_ENABLE) stay off: they do not
  // survive a dead peer (sends to it never complete, ucp_worker_destroy
  // crashes listing them).
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  cpu_set_t cpus;
  const int ncpu = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  // Wakeup support only where ranks may outnumber CPUs (see comm_wait);
  // BALLAST_COMM_BLOCK_US: how long a waiting rank goes without events
  // before it sleeps (-1: never).
  w->block_ns = env_i64("BALLAST_COMM_BLOCK_US", 20) * 1000;
  if (w->block_ns >= 0 && at.nranks > ncpu) params.features |= UCP_FEATURE_WAKEUP;
  *features = params.features;
  ucs_status_t st = ucp_init(&params, config, &w->ctx);
  ucp_config_release(config);
  if (st != UCS_OK) {
    *err = std::string("ucp_init failed: ") + ucs_status_string(st) + " (check UCX_TLS)";
    return BALLAST_EIO;
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if ((st = ucp_worker_create(w->ctx, &wp, &w->worker)) != UCS_OK) {
    *err = std::string("ucp_worker_create failed: ") + ucs_status_string(st);
    return BALLAST_EIO;
  }
  return BALLAST_OK;
}

// What this rank tells the others at the bootstrap: its pid, host and
// worker address.
int describe_self(World* w, PeerInfo* self, std::string* err) {
  ucp_address_t* ua = nullptr;
  size_t ua_len = 0;
  if (ucs_status_t st = ucp_worker_get_address(w->worker, &ua, &ua_len); st != UCS_OK) {
    *err = std::string("ucp_worker_get_address failed: ") + ucs_status_string(st);
    return BALLAST_EIO;
  }
  self->pid = int32_t(getpid());
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  self->host = host;
  self->address.assign(reinterpret_cast<uint8_t*>(ua), reinterpret_cast<uint8_t*>(ua) + ua_len);
  ucp_worker_release_address(w->worker, ua);
  return BALLAST_OK;
}

// An endpoint to every other rank of the bootstrap's answer.
int connect_peers(World* w, int rank, const PeerInfo& self, const BootstrapResult& boot, std::string* err) {
  w->job_id = boot.job_id;
  w->peers.resize(boot.peers.size());
  for (size_t i = 0; i < boot.peers.size(); ++i) {
    PeerState& ps = w->peers[i];
    ps.pid = boot.peers[i].pid;
    ps.host = boot.peers[i].host;
    ps.local = ps.host == self.host;
    if (int(i) == rank) continue;
    ucp_ep_params_t ep{};
    ep.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(boot.peers[i].address.data());
    // Shared memory offers no peer-failure handling in UCX (asking for it
    // would push local peers onto tcp): local peers are watched by pid
    // instead (check_peers), remote ones by UCX. Not for local peers over
    // tcp alone either, where it costs large allreduces a quarter of their
    // speed and the pid watch already names a dead peer.
    ep.err_mode = ps.local ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = ep_error;
    ep.err_handler.arg = &ps;
    if (ucs_status_t st = ucp_ep_create(w->worker, &ep, &ps.ep); st != UCS_OK) {
      *err = "cannot create a UCX endpoint to rank " + std::to_string(i) + ": " + ucs_status_string(st);
      return BALLAST_EPEER;
    }
  }
  return BALLAST_OK;
}

// Whether a waiting rank yields its CPU (and may sleep on the worker's
// event fd): when this host's ranks outnumber the CPUs they may run on
// together. Ranks bound one to a CPU each (as mpirun, srun or numactl do)
// are not oversubscribed, though each one's own mask holds a single CPU.
void set_waiting(World* w, uint64_t features) {
  std::vector<pid_t> local_pids;
  for (const auto& p : w->peers)
    if (p.local) local_pids.push_back(p.pid);
  const bool oversubscribed = int(local_pids.size()) > cpus_of(local_pids);
  w->yield = env_i64("BALLAST_COMM_YIELD", oversubscribed ? 1 : 0) != 0;
  if (w->yield && (features & UCP_FEATURE_WAKEUP) && ucp_worker_get_efd(w->worker, &w->efd) != UCS_OK) w->efd = -1;
}

int open_trace(World* w, const ballast_comm_config* cfg, std::string* err) {
  const bool trace = !(cfg && (cfg->flags & BALLAST_COMM_NO_TRACE)) && env_i64("BALLAST_TRACE", 1) != 0;
  if (!trace) return BALLAST_OK;
  w->ring = TraceRing::process_ring("ucx", cfg && cfg->trace_dir ? cfg->trace_dir : "", w->rank, w->nranks, err);
  if (!w->ring) return BALLAST_EIO;
  w->ring->set_closed(false);
  w->exact_ticks = env_i64("BALLAST_TRACE_EXACT", 0) != 0;
  return BALLAST_OK;
}

}  // namespace

std::shared_ptr<World> make_world(const ballast_comm_config* cfg, std::string* err, int* status) {
  Placement at;
  if ((*status = place(cfg, &at, err)) != BALLAST_OK) return nullptr;
  const int64_t deadline = monotonic_ns() + at.init_timeout_ns;
  auto w = std::make_shared<World>();
  w->rank = at.rank;
  w->nranks = at.nranks;
  w->timeout_ns = at.timeout_ns;
  const bool tcp = tcp_only(std::getenv("UCX_TLS"));
  tune(w.get(), tcp);
  uint64_t features = 0;
  if ((*status = open_ucx(w.get(), at, tcp, &features, err)) != BALLAST_OK) return nullptr;
  PeerInfo self;
  if ((*status = describe_self(w.get(), &self, err)) != BALLAST_OK) return nullptr;
  BootstrapResult boot;
  *status = bootstrap_exchange(at.rank, at.nranks, at.master_addr, at.master_port, self, deadline, &boot, err);
  if (*status != BALLAST_OK) return nullptr;
  if ((*status = connect_peers(w.get(), at.rank, self, boot, err)) != BALLAST_OK) return nullptr;
  set_waiting(w.get(), features);
  if ((*status = open_trace(w.get(), cfg, err)) != BALLAST_OK) return nullptr;
  *status = BALLAST_OK;
  return w;
}

}  // namespace ballast::comm
