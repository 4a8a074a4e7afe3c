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
    if (t == "tcp") tcp = true;
    else if (t != "self") return false;
    p = e ? e + 1 : p + t.size();
  }
  return tcp;
}

void ep_error(void* arg, ucp_ep_h, ucs_status_t status) { static_cast<PeerState*>(arg)->ep_status = status; }

}  // namespace

std::shared_ptr<World> make_world(const ballast_comm_config* cfg, std::string* err, int* status) {
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
    *status = BALLAST_EINVAL;
    return nullptr;
  }
  const std::string addr = str(cfg ? cfg->master_addr : nullptr, "MASTER_ADDR", "127.0.0.1");
  const int port = cfg && cfg->master_port > 0 ? cfg->master_port : int(env_i64("MASTER_PORT", 29500));
  int64_t timeout = cfg && cfg->timeout_ns > 0 ? cfg->timeout_ns : env_i64("BALLAST_COMM_TIMEOUT_MS", 300000) * 1000000;
  int64_t init_timeout = cfg && cfg->init_timeout_ns > 0 ? cfg->init_timeout_ns : timeout;
  if (port <= 0 || port > 65535) {
    *err = "invalid MASTER_PORT " + std::to_string(port);
    *status = BALLAST_EINVAL;
    return nullptr;
  }
  const int64_t deadline = monotonic_ns() + init_timeout;
  auto w = std::make_shared<World>();
  w->rank = rank;
  w->nranks = nranks;
  w->timeout_ns = timeout;
  // Over tcp alone, chunks of 1 MiB: a rendezvous there costs a round trip
  // that both ranks must be scheduled for, so fewer and larger ones win
  // (256 -> 512 KiB, 4 ranks on 2 CPUs, 1 MiB allreduce 1.28 -> 0.94 ms, 4 MiB
  // 5.9 -> 4.4 ms; 2 ranks, 4 MiB 1.60 -> 1.34 ms). 512 KiB -> 1 MiB, 2 ranks,
  // alternating runs: 4 MiB and 64 MiB allreduce 7% and 10% faster (70
  // pairs); and at 16 MiB, through the stretches of minutes in which this VM's
  // loopback tcp runs at half speed, 4 of 124 runs slow instead of 31 (there
  // 10.1 ms instead of 16.1; 7.4 and 7.6 ms elsewhere).
  const bool tcp = tcp_only(std::getenv("UCX_TLS"));
  w->chunk_bytes = size_t(std::max<int64_t>(4096, env_i64("BALLAST_COMM_CHUNK_BYTES", tcp ? 1 << 20 : 256 << 10)));
  w->small_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_SMALL_BYTES", 16 << 10)));
  // Not over tcp alone, where each message costs system calls on both ends:
  // 4 ranks, 8 B allreduce 24 us by recursive doubling, 43 us in one round.
  w->direct_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_DIRECT_BYTES", tcp ? 0 : 1 << 10)));
  w->halving_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_HALVING_BYTES", 512 << 10)));
  // 2 ranks over tcp alone: from 128 KiB to 1 MiB, an allreduce swaps the
  // whole buffers (one message each way, then each reduces all of it)
  // instead of the ring's reduce-scatter and allgather of halves: a message
  // over tcp costs system calls on both ends, and a rendezvous (from 512
  // KiB) a round trip more. Medians of 6 alternating runs: 512 KiB 212 ->
  // 186 us, 1 MiB 400 -> 340 us (Open MPI 204 and 324 us); at 2 MiB the
  // ring wins (630 against 690 us). Below 512 KiB the whole buffer goes
  // eager: Open MPI's p50 over ours, paired per round (9-11 rounds,
  // session 13), 128 KiB 1.09 -> 1.74, 256 KiB 0.82 -> 1.25; at 64 KiB the
  // ring's 32 KiB halves stay faster (2.09 against 1.68).
  // 2 ranks on one host otherwise (shared memory), up to 4 MiB: the swap
  // is one copy each way through the kernel (CMA), and the ring's 4 steps
  // of waits fall into a slow mode, twice its fast one, whenever the VM
  // is busy. Open MPI's p50 over ours, paired per round (session 14, 5-7
  // rounds): 128 KiB 1.36 -> 2.39, 256 KiB 1.22 -> 1.22 (its slow rounds
  // gone), 1 MiB 1.25 -> 2.28, 4 MiB 1.12 -> 1.52; the ring stays faster at
  // 8 MiB (1.45 against 1.19) and 16 MiB (1.38 against 1.12), and the
  // ring's eager halves at 64 KiB in their fast mode. Between hosts over
  // other transports the ring keeps every size (not measured here).
  w->tcp_only = tcp;
  w->pair_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_PAIR_BYTES", tcp ? 1 << 20 : 4 << 20)));
  w->pair_min_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_PAIR_MIN_BYTES", 128 << 10)));
  w->ring_direct_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_RING_DIRECT_BYTES", 4 << 20)));

  // tcp sockets with 4 MiB buffers from the start (the kernel caps them at
  // net.core.[wr]mem_max) instead of autotuned ones that start at 16 KiB: 2
  // ranks over tcp, 1 MiB allreduce 390-530 -> 300-350 us, 4 MiB 2.1 -> 1.6-1.8 ms.
  // Through the environment, not ucp_config_modify, which does not reach the
  // transports' settings in UCX 1.13; a value the user set is kept.
  // UCX's tcp transport listens on every network interface: a local job
  // (MASTER_ADDR loopback) keeps it to lo, a job over tcp alone to the
  // interface that reaches MASTER_ADDR. Other jobs keep every device (the
  // list would also hide InfiniBand ones). A user's UCX_NET_DEVICES wins.
  if (!std::getenv("UCX_NET_DEVICES") && may_use_tcp(std::getenv("UCX_TLS"))) {
    std::string ierr;
    const std::string dev = interface_towards(addr, &ierr);
    if (dev == "lo" || (tcp && !dev.empty())) setenv("UCX_NET_DEVICES", dev.c_str(), 0);
  }
  if (may_use_tcp(std::getenv("UCX_TLS"))) {  // else UCX warns of unused variables
    setenv("UCX_TCP_SNDBUF", "4M", 0);
    setenv("UCX_TCP_RCVBUF", "4M", 0);
  }
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) {
    *err = "cannot read the UCX configuration (UCX_* environment variables)";
    *status = BALLAST_EIO;
    return nullptr;
  }
  // Messages below 64 KiB go eager, not by rendezvous (UCX's own threshold
  // is lower): a rendezvous costs a round trip of control messages, and over
  // tcp its zero-copy put is emulated with active messages. Measured on this
  // 2-CPU VM, 2 ranks, 64 KiB allreduce (two 32 KiB messages per rank): sm
  // 18.0 -> 12.4 us, tcp 88 -> 25 us (Open MPI: 17.7 and 28 us). Chunks of
  // 256 KiB keep the rendezvous, which is better there (no unexpected-queue
  // copies; over sm a single copy through CMA). A user's UCX_RNDV_THRESH wins.
  // Over tcp alone, every message under 512 KiB (or under a chunk, if
  // smaller) goes eager: 2 ranks, 256 KiB allreduce (128 KiB messages) 125 -> 71 us,
  // 4 ranks 0.7 -> 0.24 ms; full chunks keep the rendezvous (all eager: 16 MiB
  // 7.5 -> 13.5 ms), and so do messages from 512 KiB (2 ranks' 512 KiB swap
  // eager: 157 -> 170 us, medians of 137 alternating runs).
  if (!std::getenv("UCX_RNDV_THRESH"))
    ucp_config_modify(config, "RNDV_THRESH",
                      tcp ? std::to_string(std::min<size_t>(w->chunk_bytes, 512 << 10)).c_str() : "64K");
  // UCX 1.13's new protocols (UCX_PROTO_ENABLE=y) would do 2 ranks' 1 MiB
  // allreduce over tcp faster (paired with the old ones, faster in 7 of 8
  // alternating runs, by 3-33%), but they do not survive a dead peer, over
  // tcp alone too (test_comm_ucx_faults with them on over tcp only): sends to
  // it never complete and ucp_worker_destroy crashes listing them; keeping
  // such a worker instead of destroying it still left ucp_tag_send_nbx
  // hitting an unimplemented stub (assertion) on the failed endpoint, in 3 of
  // 6 runs under the asan preset. Not turned on.
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  cpu_set_t cpus;
  const int ncpu = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  // Wakeup support only where ranks may outnumber CPUs (see comm_wait);
  // BALLAST_COMM_BLOCK_US: how long a waiting rank goes without events
  // before it sleeps (-1: never).
  w->block_ns = env_i64("BALLAST_COMM_BLOCK_US", 20) * 1000;
  if (w->block_ns >= 0 && nranks > ncpu) params.features |= UCP_FEATURE_WAKEUP;
  ucs_status_t st = ucp_init(&params, config, &w->ctx);
  ucp_config_release(config);
  if (st != UCS_OK) {
    *err = std::string("ucp_init failed: ") + ucs_status_string(st) + " (check UCX_TLS)";
    *status = BALLAST_EIO;
    return nullptr;
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if ((st = ucp_worker_create(w->ctx, &wp, &w->worker)) != UCS_OK) {
    *err = std::string("ucp_worker_create failed: ") + ucs_status_string(st);
    *status = BALLAST_EIO;
    return nullptr;
  }
  ucp_address_t* ua = nullptr;
  size_t ua_len = 0;
  if ((st = ucp_worker_get_address(w->worker, &ua, &ua_len)) != UCS_OK) {
    *err = std::string("ucp_worker_get_address failed: ") + ucs_status_string(st);
    *status = BALLAST_EIO;
    return nullptr;
  }
  PeerInfo self;
  self.pid = int32_t(getpid());
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  self.host = host;
  self.address.assign(reinterpret_cast<uint8_t*>(ua), reinterpret_cast<uint8_t*>(ua) + ua_len);
  ucp_worker_release_address(w->worker, ua);
  BootstrapResult boot;
  *status = bootstrap_exchange(rank, nranks, addr, port, self, deadline, &boot, err);
  if (*status != BALLAST_OK) return nullptr;
  w->job_id = boot.job_id;
  w->peers.resize(size_t(nranks));
  for (int i = 0; i < nranks; ++i) {
    PeerState& ps = w->peers[size_t(i)];
    ps.pid = boot.peers[size_t(i)].pid;
    ps.host = boot.peers[size_t(i)].host;
    ps.local = ps.host == self.host;
    if (i == rank) continue;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(boot.peers[size_t(i)].address.data());
    // Shared memory offers no peer-failure handling in UCX (asking for it
    // would push local peers onto tcp): local peers are watched by pid
    // instead (check_peers), remote ones by UCX. Not for local peers over
    // tcp alone either: there it cost 4 MiB allreduces a quarter of their
    // speed (2 ranks 3.2 -> 4.2 ms, 4 ranks 12 -> 16 ms, alternating runs),
    // and the pid watch already names a dead peer.
    ep.err_mode = ps.local ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = ep_error;
    ep.err_handler.arg = &ps;
    if ((st = ucp_ep_create(w->worker, &ep, &ps.ep)) != UCS_OK) {
      *err = "cannot create a UCX endpoint to rank " + std::to_string(i) + ": " + ucs_status_string(st);
      *status = BALLAST_EPEER;
      return nullptr;
    }
  }
  // Oversubscribed when this host's ranks outnumber the CPUs they may run
  // on together: ranks bound one to a CPU each (as mpirun, srun or numactl
  // do) are not, though each one's own mask holds a single CPU.
  std::vector<pid_t> local_pids;
  for (const auto& p : w->peers)
    if (p.local) local_pids.push_back(p.pid);
  const bool oversubscribed = int(local_pids.size()) > cpus_of(local_pids);
  w->yield = env_i64("BALLAST_COMM_YIELD", oversubscribed ? 1 : 0) != 0;
  if (w->yield && (params.features & UCP_FEATURE_WAKEUP) && ucp_worker_get_efd(w->worker, &w->efd) != UCS_OK)
    w->efd = -1;
  const bool trace = !(cfg && (cfg->flags & BALLAST_COMM_NO_TRACE)) && env_i64("BALLAST_TRACE", 1) != 0;
  if (trace) {
    std::string terr;
    w->ring = TraceRing::process_ring("ucx", cfg && cfg->trace_dir ? cfg->trace_dir : "", rank, nranks, &terr);
    if (!w->ring) {
      *err = terr;
      *status = BALLAST_EIO;
      return nullptr;
    }
    w->ring->set_closed(false);
    w->exact_ticks = env_i64("BALLAST_TRACE_EXACT", 0) != 0;
  }
  *status = BALLAST_OK;
  return w;
}

}  // namespace ballast::comm
