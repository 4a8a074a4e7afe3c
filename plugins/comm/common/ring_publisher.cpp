#include "ring_publisher.hpp"

#include <ballast/events.h>

#include <cstdlib>
#include <iterator>

namespace ballast::comm {

namespace {

void send(const ballast_host_api* host, const TraceRing& ring, const ballast_trace_slot& t, bool finished) {
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
  r.issue_ns = ring.wall_ns(t.issue_tick);
  r.start_ns = ring.wall_ns(t.start_tick);
  r.end_ns = t.end_tick ? ring.wall_ns(t.end_tick) : 0;
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
  host->publish(host, &e);
}

}  // namespace

int RingPublisher::start() {
  if (!host_ || !host_->timer_start || !host_->publish) return BALLAST_OK;  // no bus to publish on
  double period = 0.1;
  const char* v = nullptr;
  if (host_->config_get && host_->config_get(host_, "publish_period_seconds", &v) == BALLAST_OK) period = std::atof(v);
  if (!(period > 0)) {
    if (host_->set_error) host_->set_error(host_, "publish_period_seconds must be positive");
    return BALLAST_EINVAL;
  }
  if (const TraceRing* ring = TraceRing::current()) start_at(ring->head());
  auto tick = [](void* self) {
    if (const TraceRing* ring = TraceRing::current()) static_cast<RingPublisher*>(self)->publish(*ring);
  };
  const int rc = host_->timer_start(host_, uint64_t(period * 1e9), tick, this, &timer_);
  timing_ = rc == BALLAST_OK;
  return rc;
}

void RingPublisher::stop() {
  if (timing_) host_->timer_cancel(host_, timer_);
  timing_ = false;
}

int RingPublisher::publish(const TraceRing& ring) {
  const uint64_t head = ring.head();
  if (head - cursor_ > ring.capacity()) {  // overwritten before this call saw them
    const uint64_t oldest = head - ring.capacity();
    const auto seen_end = published_.lower_bound(oldest);
    const uint64_t lost = oldest - cursor_ - uint64_t(std::distance(published_.begin(), seen_end));
    if (host_->counter_add) host_->counter_add(host_, "records_lost", int64_t(lost));
    published_.erase(published_.begin(), seen_end);
    cursor_ = oldest;
  }
  int events = 0;
  // The cursor moves over finished records only while every record before
  // them is finished too; past one in flight, finished ones are remembered.
  bool blocked = false;
  for (uint64_t i = cursor_; i < head; ++i) {
    if (published_.count(i)) {
      if (!blocked) {
        published_.erase(i);
        cursor_ = i + 1;
      }
      continue;
    }
    ballast_trace_slot t;
    if (!ring.read(i, &t)) {  // being written: the next call sees it
      blocked = true;
      continue;
    }
    const bool finished = t.state == BALLAST_TRACE_DONE || t.state == BALLAST_TRACE_FAILED;
    send(host_, ring, t, finished);
    ++events;
    if (!finished) blocked = true;
    else if (!blocked) cursor_ = i + 1;
    else published_.insert(i);
  }
  return events;
}

}  // namespace ballast::comm
