// The cluster link's message framing and the agent's spool, in process.
#include "spool.hpp"
#include "wire.hpp"

#include <doctest/doctest.h>

#include <unistd.h>
#include <filesystem>

using namespace ballast::cluster;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const char* name) {
  fs::path d = fs::temp_directory_path() / (std::string(name) + "-" + std::to_string(getpid()));
  fs::remove_all(d);
  return d.string();
}

std::vector<unsigned char> frame_of(double value) {
  ballast_metric_sample s{};
  s.metric = "m";
  s.value = value;
  ballast_metric_batch b{sizeof b, 1, &s};
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
  ev.topic = "metric.sample";
  ev.ts_ns = 1;
  ev.source.rank = -1;
  ev.payload = &b;
  ev.payload_size = sizeof b;
  std::vector<unsigned char> f;
  ballast::encode_frame(ev, &f);
  return f;
}

}  // namespace

TEST_CASE("messages round-trip, arrive in pieces, and malformed ones are refused") {
  std::vector<unsigned char> buf;
  auto f = frame_of(7);
  encode_message(MsgType::event, 42, f.data(), f.size(), &buf);
  encode_message(MsgType::ack, 41, nullptr, 0, &buf);
  Message m{};
  size_t used = 0;
  std::string error;
  for (size_t n = 0; n < kMessageHeaderSize + f.size(); ++n)
    CHECK(decode_message(buf.data(), n, &m, &used, &error) == 0);
  REQUIRE(decode_message(buf.data(), buf.size(), &m, &used, &error) == 1);
  CHECK(m.type == MsgType::event);
  CHECK(m.number == 42);
  CHECK(m.body_size == f.size());
  REQUIRE(decode_message(buf.data() + used, buf.size() - used, &m, &used, &error) == 1);
  CHECK(m.type == MsgType::ack);
  CHECK(m.number == 41);

  std::vector<unsigned char> bad = buf;
  bad[0] = 'X';
  CHECK(decode_message(bad.data(), bad.size(), &m, &used, &error) == -1);
  CHECK(error.find("magic") != std::string::npos);
  bad = buf;
  bad[4] = 99;
  CHECK(decode_message(bad.data(), bad.size(), &m, &used, &error) == -1);
  CHECK(error.find("unknown message type") != std::string::npos);
  bad = buf;
  bad[8] = bad[9] = bad[10] = bad[11] = 0xff;  // 4 GiB body
  CHECK(decode_message(bad.data(), bad.size(), &m, &used, &error) == -1);
  CHECK(error.find("above the limit") != std::string::npos);
}

TEST_CASE("host:port addresses are checked") {
  std::string h, e;
  uint16_t p = 0;
  CHECK(split_host_port("10.0.0.1:7700", &h, &p, &e));
  CHECK(h == "10.0.0.1");
  CHECK(p == 7700);
  CHECK(split_host_port("[::1]:80", &h, &p, &e));
  CHECK(h == "::1");
  CHECK_FALSE(split_host_port("nohost", &h, &p, &e));
  CHECK_FALSE(split_host_port("h:0", &h, &p, &e));
  CHECK_FALSE(split_host_port("h:99999", &h, &p, &e));
  CHECK_FALSE(split_host_port("h:7a", &h, &p, &e));
}

TEST_CASE("the spool numbers, trims on acknowledgement, survives a restart and counts its overflow") {
  SpoolOptions o;
  o.dir = fresh_dir("spool");
  o.max_bytes = 64 << 10;
  o.segment_bytes = 4 << 10;
  auto f = frame_of(1);
  uint64_t last = 0;
  {
    std::unique_ptr<Spool> s;
    REQUIRE(Spool::open(o, "n1", &s) == BALLAST_OK);
    for (int i = 0; i < 100; ++i) {
      uint64_t seq = 0;
      REQUIRE(s->append(f.data(), f.size(), &seq) == BALLAST_OK);
      CHECK(seq == static_cast<uint64_t>(i + 1));
    }
    s->acknowledge(60);
    CHECK(s->acked() == 60);
    std::vector<uint64_t> got;
    REQUIRE(s->read(61, 100, [&](uint64_t seq, const std::vector<unsigned char>& fr) {
      CHECK(fr == f);
      got.push_back(seq);
      return true;
    }) == BALLAST_OK);
    REQUIRE(got.size() == 40);
    CHECK(got.front() == 61);
    CHECK(got.back() == 100);
    last = s->last_seq();
  }
  // Segments entirely acknowledged are gone; the rest is found again.
  size_t segments = 0;
  for (auto& e : fs::directory_iterator(o.dir)) segments += e.path().filename().string().rfind("seg-", 0) == 0;
  CHECK(segments >= 1);
  std::unique_ptr<Spool> s;
  REQUIRE(Spool::open(o, "n1", &s) == BALLAST_OK);
  CHECK(s->last_seq() == last);
  CHECK(s->acked() == 60);
  uint64_t seq = 0;
  REQUIRE(s->append(f.data(), f.size(), &seq) == BALLAST_OK);
  CHECK(seq == 101);
  // Fill to the bound: what does not fit is refused and counted, not numbered.
  int refused = 0;
  for (int i = 0; i < 2000; ++i)
    if (s->append(f.data(), f.size(), &seq) == BALLAST_EFULL) ++refused;
  CHECK(refused > 0);
  CHECK(s->overflow() == static_cast<uint64_t>(refused));
  CHECK(s->bytes() <= o.max_bytes);
  uint64_t before = s->last_seq();
  s->acknowledge(before);
  CHECK(s->append(f.data(), f.size(), &seq) == BALLAST_OK);
  CHECK(seq == before + 1);
  // A controller that applied more than this spool knows: numbering continues after it.
  s->skip_to(seq + 50);
  REQUIRE(s->append(f.data(), f.size(), &seq) == BALLAST_OK);
  CHECK(seq == before + 52);
}
