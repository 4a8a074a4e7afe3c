#include "ring_publisher.hpp"

#include <ballast/events.h>

#include <algorithm>
#include <cstdlib>

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

RingPublisher::RingPublisher(const ballast_host_api* host) : host_(host) {
  const char* v = nullptr;
  if (host_ && host_->config_get(host_, "publish_period_seconds", &v) == BALLAST_OK) period_ = std::atof(v);
}

int RingPublisher::start() {
  if (!host_) return BALLAST_OK;  // made without a host (the plugin's own tests): no bus to publish on
  const double period = period_;
  if (!(period > 0)) {
    host_->set_error(host_, "publish_period_seconds must be positive");
    return BALLAST_EINVAL;
  }
  if (const TraceRing* ring = TraceRing::current()) start_at(ring->head(), ring->skipped());
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
  const uint64_t n = ring.capacity();
  slots_.resize(n);
  struct News {
    uint64_t index;
    ballast_trace_slot t;
    bool finished;
  };
  std::vector<News> news;
  uint64_t gaps = 0;  // indices that went by a slot unseen: skipped, or records lost
  for (uint64_t k = 0; k < n; ++k) {
    Seen& seen = slots_[k];
    if (seen.any && seen.finished && ring.holds(k, seen.index)) continue;  // nothing new
    uint64_t i = 0;
    ballast_trace_slot t;
    if (!ring.read_slot(k, &i, &t) || i < start_) continue;  // empty, being written, or old news
    if (!seen.any || i != seen.index) {
      const uint64_t first = seen.any ? seen.index + n : start_ + ((k - start_) & (n - 1));
      gaps += (i - first) / n;
      if (seen.any && !seen.finished) ++gaps;  // seen in flight, ended and overwritten unseen
    }
    const bool finished = t.state == BALLAST_TRACE_DONE || t.state == BALLAST_TRACE_FAILED;
    seen = Seen{true, i, finished};
    news.push_back({i, t, finished});
  }
  const uint64_t skipped = ring.skipped();
  skip_credit_ += skipped - skipped_;
  skipped_ = skipped;
  const uint64_t skips = std::min(gaps, skip_credit_);
  skip_credit_ -= skips;
  if (gaps > skips && host_->counter_add) host_->counter_add(host_, "records_lost", int64_t(gaps - skips));
  std::sort(news.begin(), news.end(), [](const News& a, const News& b) { return a.index < b.index; });
  for (const News& x : news) send(host_, ring, x.t, x.finished);
  return int(news.size());
}

}  // namespace ballast::comm
