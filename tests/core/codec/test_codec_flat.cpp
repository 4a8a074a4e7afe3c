// Flattened copies (codec_flat): strings of every short length at every
// alignment, strings that end at the edge of a readable page, copies into
// buffers that are too small, and copies that point at a stable topic.
#include <doctest/doctest.h>

#include "codec_flat.hpp"

#include <ballast/events.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

using namespace ballast;

namespace {

ballast_event metric_event(const char* topic, const char* node, const char* plugin, const ballast_metric_batch* batch) {
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
  ev.topic = topic;
  ev.ts_ns = 42;
  ev.source = {node, 3, plugin};
  ev.payload = batch;
  ev.payload_size = sizeof *batch;
  return ev;
}

// Whether `copy` holds the same strings and sample as `ev`, all inside `buf`.
void check_copy(const ballast_event& copy, const ballast_event& ev, const unsigned char* buf, size_t bytes) {
  const auto inside = [&](const void* p) {
    const auto* c = static_cast<const unsigned char*>(p);
    return c >= buf && c < buf + bytes;
  };
  CHECK(std::string(copy.topic) == ev.topic);
  CHECK(std::string(copy.source.node) == ev.source.node);
  CHECK(std::string(copy.source.plugin) == ev.source.plugin);
  CHECK(copy.source.rank == 3);
  CHECK(copy.ts_ns == 42);
  CHECK(inside(copy.topic));
  CHECK(inside(copy.source.node));
  CHECK(inside(copy.source.plugin));
  const auto* batch = static_cast<const ballast_metric_batch*>(copy.payload);
  const auto* orig = static_cast<const ballast_metric_batch*>(ev.payload);
  REQUIRE(inside(batch));
  REQUIRE(batch->count == orig->count);
  for (uint32_t i = 0; i < batch->count; ++i) {
    CHECK(inside(batch->samples + i));
    CHECK(std::string(batch->samples[i].metric) == orig->samples[i].metric);
    if (orig->samples[i].node == nullptr)
      CHECK(batch->samples[i].node == nullptr);
    else
      CHECK(std::string(batch->samples[i].node) == orig->samples[i].node);
    CHECK(batch->samples[i].value == orig->samples[i].value);
  }
}

}  // namespace

TEST_CASE("strings of 0 to 40 characters at every alignment are copied whole") {
  alignas(64) char text[256];
  for (size_t len = 0; len <= 40; ++len) {
    for (size_t at = 0; at < 32; ++at) {
      CAPTURE(len);
      CAPTURE(at);
      // The string, with non-NUL bytes on both sides of it in the same blocks.
      std::memset(text, 'q', sizeof text);
      for (size_t i = 0; i < len; ++i) text[at + i] = static_cast<char>('a' + i % 26);
      text[at + len] = '\0';
      const char* str = text + at;
      ballast_metric_sample sample = {str, str, 7, 1.5, 0};
      ballast_metric_batch batch = {sizeof batch, 1, &sample};
      const ballast_event ev = metric_event("a.b", str, str, &batch);
      const size_t need = codec::flat_size(ev);
      std::vector<uint64_t> buf((need + 7) / 8 + 1);
      auto* bytes = reinterpret_cast<unsigned char*>(buf.data());
      ballast_event copy{};
      codec::flatten(ev, bytes, &copy);
      check_copy(copy, ev, bytes, need);
    }
  }
}

TEST_CASE("a string that ends at the last byte of a readable page is copied without reading the next page") {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* map = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(map != MAP_FAILED);
  auto* first = static_cast<char*>(map);
  REQUIRE(mprotect(first + page, page, PROT_NONE) == 0);  // touching it would crash the test
  for (size_t len = 0; len <= 40; ++len) {
    CAPTURE(len);
    std::memset(first, 'z', page);
    char* str = first + page - len - 1;  // its NUL is the page's last byte
    for (size_t i = 0; i < len; ++i) str[i] = static_cast<char>('A' + i % 26);
    str[len] = '\0';
    ballast_metric_sample sample = {str, str, 7, 2.5, 0};
    ballast_metric_batch batch = {sizeof batch, 1, &sample};
    const ballast_event ev = metric_event(str, str, str, &batch);
    const size_t need = codec::flat_size(ev);
    std::vector<uint64_t> buf((need + 7) / 8);
    auto* bytes = reinterpret_cast<unsigned char*>(buf.data());
    ballast_event copy{};
    codec::flatten(ev, bytes, &copy);
    check_copy(copy, ev, bytes, need);
  }
  munmap(map, 2 * page);
}

TEST_CASE("flatten_into never writes past its capacity and says when the copy does not fit") {
  ballast_metric_sample samples[3] = {{"node-a", "cpu.user", 1, 1.0, 0},
                                      {"node-bb", "a.metric.name.longer.than.thirty.two.bytes", 2, 2.0, 0},
                                      {nullptr, "m", 3, 3.0, 1}};
  ballast_metric_batch batch = {sizeof batch, 3, samples};
  const ballast_event ev = metric_event("metric.sample", "node-1", "bench", &batch);
  const size_t need = codec::flat_size(ev);
  constexpr unsigned char kCanary = 0xA5;
  for (size_t cap = 0; cap <= need + 8; ++cap) {
    CAPTURE(cap);
    std::vector<uint64_t> buf((need + 64) / 8 + 1);
    auto* bytes = reinterpret_cast<unsigned char*>(buf.data());
    std::memset(bytes, kCanary, buf.size() * 8);
    ballast_event copy{};
    size_t needed = 0;
    const bool fits = codec::flatten_into(ev, bytes, cap, &copy, &needed);
    CHECK(needed == need);
    CHECK(fits == (cap >= need));
    for (size_t i = cap; i < buf.size() * 8; ++i) REQUIRE(bytes[i] == kCanary);
    if (fits) {
      check_copy(copy, ev, bytes, need);
      CHECK(static_cast<const ballast_metric_batch*>(copy.payload)->samples[2].node == nullptr);
    }
  }
}

TEST_CASE("a stable topic is pointed at, not copied, and copy_flat leaves it in place") {
  static const char kStable[] = "metric.sample";
  std::string topic = kStable;  // the publisher's buffer, overwritten below
  ballast_metric_sample sample = {"node-1", "cpu.user", 1, 4.0, 0};
  ballast_metric_batch batch = {sizeof batch, 1, &sample};
  const ballast_event ev = metric_event(topic.c_str(), "node-1", "bench", &batch);
  const size_t with_copy = codec::flat_size(ev);
  const size_t need = codec::flat_size(ev, kStable);
  CHECK(need == with_copy - sizeof kStable);  // the topic and its NUL are not in the buffer
  std::vector<uint64_t> a((need + 7) / 8), b((need + 7) / 8);
  auto* from = reinterpret_cast<unsigned char*>(a.data());
  auto* to = reinterpret_cast<unsigned char*>(b.data());
  ballast_event flat{}, moved{};
  codec::flatten(ev, from, &flat, kStable);
  CHECK(flat.topic == kStable);
  codec::copy_flat(flat, from, need, to, &moved);
  std::memset(from, 0, need);  // the second copy must not point into the first
  topic.assign(topic.size(), 'x');
  CHECK(moved.topic == kStable);
  CHECK(std::string(moved.source.node) == "node-1");
  CHECK(std::string(moved.source.plugin) == "bench");
  const auto* copy = static_cast<const ballast_metric_batch*>(moved.payload);
  CHECK(reinterpret_cast<const unsigned char*>(copy) == to);
  CHECK(std::string(copy->samples[0].metric) == "cpu.user");
  CHECK(copy->samples[0].value == 4.0);
}
