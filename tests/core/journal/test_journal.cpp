// The journal: round trip, and truncated, corrupted and padded files, each
// problem reported with its offset and nothing bad trusted.
#include <doctest/doctest.h>

#include "error.hpp"
#include "journal.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

using namespace ballast;
namespace fs = std::filesystem;

namespace {

// A fresh file path under the build's test folder, removed at scope exit.
struct TempFile {
  fs::path path;
  explicit TempFile(const std::string& name)
      : path(fs::temp_directory_path() / ("ballast-journal-" + std::to_string(::getpid()) + "-" + name)) {
    fs::remove(path);
  }
  ~TempFile() { fs::remove(path); }
};

ballast_metric_sample g_sample = {"node-1", "cpu.user", 5, 0.5, 0};

ballast_event metric(int64_t ts, ballast_metric_batch* batch) {
  *batch = {sizeof(ballast_metric_batch), 1, &g_sample};
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
  ev.topic = "metric.sample";
  ev.ts_ns = ts;
  ev.source = {"node-1", 3, "machine"};
  ev.payload = batch;
  ev.payload_size = sizeof *batch;
  return ev;
}

std::vector<unsigned char> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

void spit(const fs::path& p, const std::vector<unsigned char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

struct Read {
  int status;
  std::vector<int64_t> ts;        // ts_ns of the good events, in order
  std::vector<uint64_t> offsets;  // their offsets
  std::vector<JournalProblem> problems;
};

Read read(const fs::path& p, JournalMode mode) {
  Read r;
  r.status = read_journal(
      p.string(), mode,
      [&](const OwnedEvent& ev, uint64_t off) {
        // Every good event must be fully intact.
        const auto& b = *static_cast<const ballast_metric_batch*>(ev.view().payload);
        CHECK(std::string(ev.view().topic) == "metric.sample");
        REQUIRE(b.count == 1);
        CHECK(std::string(b.samples[0].metric) == "cpu.user");
        r.ts.push_back(ev.view().ts_ns);
        r.offsets.push_back(off);
      },
      [&](const JournalProblem& pr) { r.problems.push_back(pr); });
  return r;
}

// Write n events (ts 1..n) and return each frame's offset, plus the file size at the end.
std::vector<uint64_t> write_events(const fs::path& p, int n) {
  JournalWriter w;
  REQUIRE(w.open(p.string()) == BALLAST_OK);
  std::vector<uint64_t> offsets;
  for (int i = 1; i <= n; ++i) {
    offsets.push_back(fs::exists(p) ? fs::file_size(p) : 0);
    ballast_metric_batch b;
    REQUIRE(w.append(metric(i, &b)) == BALLAST_OK);
  }
  REQUIRE(w.flush(true) == BALLAST_OK);
  offsets.push_back(fs::file_size(p));
  return offsets;
}

}  // namespace

TEST_CASE("journal round trip, appended across two writers") {
  TempFile f("roundtrip");
  auto offs = write_events(f.path, 5);
  {
    JournalWriter w;  // reopening appends
    REQUIRE(w.open(f.path.string()) == BALLAST_OK);
    ballast_metric_batch b;
    REQUIRE(w.append(metric(6, &b)) == BALLAST_OK);
  }
  Read r = read(f.path, JournalMode::refuse_bad);
  CHECK(r.status == BALLAST_OK);
  CHECK(r.problems.empty());
  CHECK(r.ts == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  offs.pop_back();
  r.offsets.pop_back();
  CHECK(r.offsets == offs);
}

TEST_CASE("journal appends from several threads interleave whole frames, flushed as they go") {
  TempFile f("threads");
  JournalWriter w;
  REQUIRE(w.open(f.path.string()) == BALLAST_OK);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&w, t] {
      for (int i = 0; i < 500; ++i) {
        ballast_metric_batch b;
        CHECK(w.append(metric(t * 1000 + i, &b)) == BALLAST_OK);
        if (i % 50 == 49) CHECK(w.flush(true) == BALLAST_OK);
      }
    });
  }
  for (auto& t : threads) t.join();
  w.close();
  Read r = read(f.path, JournalMode::refuse_bad);
  CHECK(r.status == BALLAST_OK);
  REQUIRE(r.ts.size() == 2000);
  // Each writer's frames stay in its order.
  std::vector<int64_t> last(4, -1);
  for (int64_t ts : r.ts) {
    CHECK(ts % 1000 > last[ts / 1000]);
    last[ts / 1000] = ts % 1000;
  }
}

TEST_CASE("a grouped journal: appends from several threads written in bursts, all there after flush, in order") {
  TempFile f("grouped");
  JournalWriter w;
  REQUIRE(w.open(f.path.string(), JournalWriter::Mode::grouped) == BALLAST_OK);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&w, t] {
      for (int i = 0; i < 500; ++i) {
        ballast_metric_batch b;
        CHECK(w.append(metric(t * 1000 + i, &b)) == BALLAST_OK);
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(w.flush(true) == BALLAST_OK);
  // Flushed: on disk before close.
  Read r = read(f.path, JournalMode::refuse_bad);
  CHECK(r.status == BALLAST_OK);
  REQUIRE(r.ts.size() == 2000);
  std::vector<int64_t> last(4, -1);
  for (int64_t ts : r.ts) {
    CHECK(ts % 1000 > last[ts / 1000]);
    last[ts / 1000] = ts % 1000;
  }
  // Closing writes what is still handed over.
  ballast_metric_batch b;
  REQUIRE(w.append(metric(9999, &b)) == BALLAST_OK);
  w.close();
  CHECK(read(f.path, JournalMode::refuse_bad).ts.size() == 2001);
}

TEST_CASE("append_batch: one write of every frame, or none when one event is bad") {
  TempFile f("batch");
  JournalWriter w;
  REQUIRE(w.open(f.path.string()) == BALLAST_OK);
  ballast_metric_batch b[3];
  std::vector<ballast_event> evs = {metric(1, &b[0]), metric(2, &b[1]), metric(3, &b[2])};
  REQUIRE(w.append_batch(evs.data(), evs.size()) == BALLAST_OK);
  evs[1].topic = nullptr;  // not a valid event
  CHECK(w.append_batch(evs.data(), evs.size()) == BALLAST_EINVAL);
  CHECK(std::string(last_error()).find(f.path.string()) != std::string::npos);
  CHECK(w.append_batch(evs.data(), 0) == BALLAST_OK);
  w.close();
  Read r = read(f.path, JournalMode::refuse_bad);
  CHECK(r.status == BALLAST_OK);
  CHECK(r.ts == std::vector<int64_t>{1, 2, 3});
}

TEST_CASE("a journal cut at every byte of its last frame: the good frames, then the cut reported") {
  TempFile f("full");
  const auto offs = write_events(f.path, 3);
  const auto bytes = slurp(f.path);
  const uint64_t last = offs[2];
  TempFile cut("cut");
  for (uint64_t end = last + 1; end < bytes.size(); ++end) {
    CAPTURE(end);
    spit(cut.path, std::vector<unsigned char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(end)));
    for (JournalMode mode : {JournalMode::skip_bad, JournalMode::refuse_bad}) {
      Read r = read(cut.path, mode);
      CHECK(r.ts == std::vector<int64_t>{1, 2});
      REQUIRE(r.problems.size() == 1);
      CHECK(r.problems[0].offset == last);
      CHECK(r.problems[0].reason.find("truncated frame") == 0);
      CHECK(r.status == (mode == JournalMode::refuse_bad ? BALLAST_EFORMAT : BALLAST_OK));
    }
  }
  // Cut exactly at the frame boundary: nothing is wrong.
  spit(cut.path, std::vector<unsigned char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(last)));
  Read r = read(cut.path, JournalMode::refuse_bad);
  CHECK(r.status == BALLAST_OK);
  CHECK(r.problems.empty());
}

TEST_CASE("a corrupted byte fails the checksum: skipped or refused, with its offset") {
  TempFile f("crc");
  const auto offs = write_events(f.path, 4);
  auto bytes = slurp(f.path);
  bytes[offs[1] + kFrameHeaderSize + 3] ^= 0x01;  // inside the second frame's body
  spit(f.path, bytes);

  Read skip = read(f.path, JournalMode::skip_bad);
  CHECK(skip.status == BALLAST_OK);
  CHECK(skip.ts == std::vector<int64_t>{1, 3, 4});
  REQUIRE(skip.problems.size() == 1);
  CHECK(skip.problems[0].offset == offs[1]);
  CHECK(skip.problems[0].reason.find("checksum mismatch") == 0);

  Read refuse = read(f.path, JournalMode::refuse_bad);
  CHECK(refuse.status == BALLAST_EFORMAT);
  CHECK(refuse.ts == std::vector<int64_t>{1});
  CHECK(std::string(last_error()).find("byte " + std::to_string(offs[1]) + ": checksum mismatch") != std::string::npos);
}

TEST_CASE("garbage between frames is reported once and skipped to the next frame") {
  TempFile f("garbage");
  const auto offs = write_events(f.path, 3);
  auto bytes = slurp(f.path);
  const std::string junk = "this is not a frame; BLF nor BL";
  bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(offs[1]), junk.begin(), junk.end());
  spit(f.path, bytes);
  Read r = read(f.path, JournalMode::skip_bad);
  CHECK(r.ts == std::vector<int64_t>{1, 2, 3});
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].offset == offs[1]);
  CHECK(r.problems[0].reason.find("bad magic") == 0);
  CHECK(r.offsets[1] == offs[1] + junk.size());
}

TEST_CASE("a torn frame followed by frames appended later: reported, and the later frames kept") {
  // A writer died halfway through a frame; the next run appended to the file.
  TempFile f("torn");
  const auto offs = write_events(f.path, 2);
  auto bytes = slurp(f.path);
  const size_t cut = offs[1] + (offs[2] - offs[1]) / 2;
  bytes.resize(cut);
  spit(f.path, bytes);
  {
    JournalWriter w;
    REQUIRE(w.open(f.path.string()) == BALLAST_OK);
    ballast_metric_batch b;
    REQUIRE(w.append(metric(7, &b)) == BALLAST_OK);
    REQUIRE(w.append(metric(8, &b)) == BALLAST_OK);
  }
  Read r = read(f.path, JournalMode::skip_bad);
  CHECK(r.status == BALLAST_OK);
  CHECK(r.ts == std::vector<int64_t>{1, 7, 8});
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].offset == offs[1]);
  CHECK(r.offsets[1] == cut);
}

TEST_CASE("an oversized length is refused without reading it, and skipped") {
  TempFile f("oversized");
  const auto offs = write_events(f.path, 3);
  auto bytes = slurp(f.path);
  const uint32_t huge = 0xFFFFFFF0u;
  std::memcpy(bytes.data() + offs[0] + 8, &huge, 4);
  spit(f.path, bytes);
  Read r = read(f.path, JournalMode::skip_bad);
  CHECK(r.ts == std::vector<int64_t>{2, 3});
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].offset == 0);
  CHECK(r.problems[0].reason.find("above the limit") != std::string::npos);
  // A length within the limit but past the end of the file.
  const uint32_t big = 1000000;
  std::memcpy(bytes.data() + offs[0] + 8, &big, 4);
  spit(f.path, bytes);
  r = read(f.path, JournalMode::skip_bad);
  CHECK(r.ts == std::vector<int64_t>{2, 3});
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].reason.find("truncated frame: header says 1000000 bytes") == 0);
}

TEST_CASE("journal errors name the file") {
  CHECK(read_journal("/nonexistent/ballast.journal", JournalMode::skip_bad, {}, {}) == BALLAST_ENOTFOUND);
  CHECK(std::string(last_error()).find("/nonexistent/ballast.journal") == 0);
  JournalWriter w;
  CHECK(w.open("/nonexistent/dir/j") == BALLAST_EIO);
  CHECK(std::string(last_error()).find("/nonexistent/dir/j") == 0);
  ballast_metric_batch b;
  CHECK(w.append(metric(1, &b)) == BALLAST_ESTATE);
  TempFile f("empty");
  spit(f.path, {});
  Read r = read(f.path, JournalMode::refuse_bad);
  CHECK(r.status == BALLAST_OK);
  CHECK(r.ts.empty());
}
