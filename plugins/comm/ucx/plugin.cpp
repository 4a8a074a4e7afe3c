// ballast-comm-ucx: the plugin entry. The logic is in ucx_comm.cpp.
#include "ucx_comm.hpp"

#include "trace_ring.hpp"

#include <ballast/comm.h>
#include <ballast/events.h>
#include <ballast/plugin.h>

#include <cstdlib>
#include <iterator>
#include <set>
#include <string_view>

namespace {

using namespace ballast::comm;

struct State {
  const ballast_host_api* host;
  uint64_t timer = 0;
  bool timing = false;
  uint64_t cursor = 0;             // records before it were all published as collective.record
  std::set<uint64_t> published;    // finished records at or after cursor already published
};

// Publish the ring's news on the bus: collective.record once per finished
// operation, collective.progress for each one still in flight. Timer thread.
// The ring itself is the always-on trace; the bus gets what the period lets
// it read (publish_period_seconds against the ring's slots).
void publish_ring(void* user) {
  auto* s = static_cast<State*>(user);
  TraceRing* ring = TraceRing::current();
  if (!ring) return;
  const uint64_t head = ring->head();
  if (head > s->cursor + ring->capacity()) {
    // Overwritten before this timer saw them: more operations in one period
    // than the ring holds. Counted (comm-ucx.records_lost), never guessed.
    const uint64_t oldest = head - ring->capacity();
    const auto seen_end = s->published.lower_bound(oldest);
    const uint64_t lost = oldest - s->cursor - uint64_t(std::distance(s->published.begin(), seen_end));
    if (s->host->counter_add) s->host->counter_add(s->host, "records_lost", int64_t(lost));
    s->published.erase(s->published.begin(), seen_end);
    s->cursor = oldest;
  }
  bool advance = true;
  for (uint64_t i = s->cursor; i < head; ++i) {
    ballast_trace_slot t;
    if (!ring->read(i, &t)) {
      advance = false;
      continue;
    }
    const bool finished = t.state == BALLAST_TRACE_DONE || t.state == BALLAST_TRACE_FAILED;
    if (finished && s->published.count(i)) {
      if (advance) {
        s->published.erase(i);
        s->cursor = i + 1;
      }
      continue;
    }
    ballast_collective_record r{};
    r.size = sizeof r;
    r.state = t.state;
    r.comm_id = t.comm_id;
    r.seq = t.seq;
    r.op = ballast_op_name(t.op);
    r.dtype = ballast_dtype_name(t.dtype);
    r.algorithm = ballast_algorithm_name(t.algorithm);
    r.count = t.count;
    r.bytes = t.bytes;
    r.rank = t.rank;
    r.nranks = t.nranks;
    r.peer = t.peer;
    r.status = t.status;
    r.issue_ns = ring->wall_ns(t.issue_tick);
    r.start_ns = ring->wall_ns(t.start_tick);
    r.end_ns = t.end_tick ? ring->wall_ns(t.end_tick) : 0;
    r.chunks_posted = t.chunks_posted;
    r.chunks_sent = t.chunks_sent;
    r.chunks_received = t.chunks_received;
    r.chunks_reduced = t.chunks_reduced;
    ballast_event e{};
    e.size = sizeof e;
    e.schema = BALLAST_SCHEMA_COLLECTIVE_RECORD;
    e.topic = finished ? "collective.record" : "collective.progress";
    e.source.rank = t.world_rank;
    e.payload = &r;
    e.payload_size = sizeof r;
    s->host->publish(s->host, &e);
    if (!finished) {
      advance = false;
    } else if (advance) {
      s->cursor = i + 1;
    } else {
      s->published.insert(i);
    }
  }
}

int start(void* state) {
  auto* s = static_cast<State*>(state);
  if (!s->host || !s->host->timer_start || !s->host->publish) return BALLAST_OK;
  double period = 0.1;
  const char* v = nullptr;
  if (s->host->config_get && s->host->config_get(s->host, "publish_period_seconds", &v) == BALLAST_OK) period = std::atof(v);
  if (period <= 0) {
    s->host->set_error(s->host, "comm-ucx: publish_period_seconds must be positive");
    return BALLAST_EINVAL;
  }
  if (TraceRing* ring = TraceRing::current()) s->cursor = ring->head();  // only what happens from now on
  const int rc = s->host->timer_start(s->host, uint64_t(period * 1e9), publish_ring, s, &s->timer);
  s->timing = rc == BALLAST_OK;
  return rc;
}

void stop(void* state) {
  auto* s = static_cast<State*>(state);
  if (s->timing) s->host->timer_cancel(s->host, s->timer);
  s->timing = false;
}

// Failures are also handed to the host, so that `ballast` prints them.
int report(void* state, int rc) {
  auto* s = static_cast<State*>(state);
  if (rc != BALLAST_OK && s && s->host && s->host->size > offsetof(ballast_host_api, set_error) && s->host->set_error)
    s->host->set_error(s->host, last_error());
  return rc;
}

int api_init(void* state, const ballast_comm_config* cfg, ballast_comm** comm) {
  return report(state, comm_init(cfg, reinterpret_cast<Comm**>(comm)));
}
int api_split(ballast_comm* parent, int32_t colour, int32_t key, ballast_comm** out) {
  return comm_split(reinterpret_cast<Comm*>(parent), colour, key, reinterpret_cast<Comm**>(out));
}
void api_destroy(ballast_comm* comm) { comm_destroy(reinterpret_cast<Comm*>(comm)); }
int api_abort(ballast_comm* comm, const char* reason) { return comm_abort(reinterpret_cast<Comm*>(comm), reason); }
int api_info(ballast_comm* comm, ballast_comm_info* info) { return comm_info(reinterpret_cast<Comm*>(comm), info); }
int api_start(ballast_comm* comm, const ballast_comm_args* args, ballast_comm_request** req) {
  return comm_start(reinterpret_cast<Comm*>(comm), args, req);
}
int api_run(ballast_comm* comm, const ballast_comm_args* args) { return comm_run(reinterpret_cast<Comm*>(comm), args); }
const char* api_last_error(void*) { return last_error(); }

const ballast_comm_api kApi = {sizeof(ballast_comm_api), 0, api_init, api_split, api_destroy, api_abort, api_info,
                               api_start, comm_test, comm_wait, api_run, api_last_error};

int create(const ballast_host_api* host, void** state) {
  auto* s = new State();
  s->host = host;
  *state = s;
  return BALLAST_OK;
}
void destroy(void* state) { delete static_cast<State*>(state); }

const void* get_interface(void*, const char* name, uint32_t version) {
  const std::string_view n = name ? name : "";
  return n == BALLAST_COMM_INTERFACE && version == BALLAST_COMM_VERSION ? &kApi : nullptr;
}

const ballast_interface_info kInterfaces[] = {{BALLAST_COMM_INTERFACE, BALLAST_COMM_VERSION}, {nullptr, 0}};

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor), BALLAST_ABI_MAJOR, BALLAST_ABI_MINOR, 0, "comm-ucx", "0.1.0", "comm",
    "collectives between processes over UCX, traced in a shared-memory ring",
    create, start, stop, destroy, get_interface, kInterfaces};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t) { return &kDescriptor; }
