// Publishing allocates nothing once a topic is known: inline delivery never,
// queued delivery not once each slot has held an event of that size.
// A separate executable, since it replaces the global operator new.
#include <doctest/doctest.h>

#include "bus.hpp"

#include <ballast/events.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <thread>

namespace {
thread_local long t_allocations = 0;  // this thread's operator new calls
}

void* operator new(std::size_t n) {
  ++t_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  ++t_allocations;
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

using namespace ballast;

namespace {

std::atomic<long> g_seen{0};
int count(void*, const ballast_event*) {
  g_seen.fetch_add(1);
  return 0;
}

ballast_metric_sample g_samples[64];
ballast_metric_batch g_batch = {sizeof(ballast_metric_batch), 1, g_samples};

ballast_event metric(uint32_t samples) {
  for (auto& s : g_samples) s = {"node-1", "cpu.user", 1, 1.0, 0};
  g_batch.count = samples;
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
  ev.topic = "metric.sample";
  ev.source = {"node-1", 0, "test"};
  ev.payload = &g_batch;
  ev.payload_size = sizeof g_batch;
  return ev;
}

}  // namespace

TEST_CASE("publishing a known topic allocates nothing, inline or queued") {
  Bus bus;
  uint64_t id = 0;
  ballast_subscribe_options q = {sizeof q, BALLAST_DELIVER_QUEUED, 0, 64};
  REQUIRE(bus.subscribe("metric.*", nullptr, count, nullptr, "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("metric.sample", &q, count, nullptr, "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("*", &q, count, nullptr, "t", &id) == BALLAST_OK);
  // Warm-up: interns the topic, registers this thread, and lets every slot
  // hold a large event once (64 samples do not fit a slot's inline buffer).
  for (int i = 0; i < 256; ++i) REQUIRE(bus.publish(metric(i % 2 == 0 ? 1 : 64)) == BALLAST_OK);
  const long before = t_allocations;
  CHECK(before > 0);  // the counter sees allocations: interning the topic made some
  for (int i = 0; i < 10000; ++i) REQUIRE(bus.publish(metric(i % 2 == 0 ? 1 : 64)) == BALLAST_OK);
  CHECK(t_allocations - before == 0);
  bus.shutdown();
  CHECK(g_seen.load() == 3 * 10256);
}
