#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>

#include "helpers.hpp"
#include "stages.hpp"
#include "util.hpp"

using namespace ballast::startup;
using startup_test::TempDir;

TEST_CASE("stage records round-trip through the JSON-lines log and the report adds them up") {
  TempDir d;
  std::string log_path = d / "stages.jsonl";
  StageLog log(nullptr, log_path);
  const int64_t s = 1'000'000'000'000;
  auto rec = [&](const char* stage, int rank, int64_t a, int64_t b, uint64_t bytes) {
    StageRecord r;
    r.stage = stage;
    r.rank = rank;
    r.node = "n1";
    r.start_ns = s + a;
    r.end_ns = s + b;
    r.bytes = bytes;
    log.record(r);
  };
  rec("environment", 0, 0, 2'000'000'000, 100);
  rec("checkpoint_load", 0, 2'000'000'000, 5'000'000'000, 1 << 30);
  rec("checkpoint_load", 1, 2'500'000'000, 6'000'000'000, 1 << 30);
  rec("first_step", 0, 7'000'000'000, 8'000'000'000, 0);

  auto records = read_stages(log_path);
  REQUIRE(records.size() == 4);
  CHECK(records[1].bytes == (1u << 30));
  CHECK(records[2].rank == 1);

  auto rep = stage_report(records);
  CHECK(rep["wall_s"].get<double>() == doctest::Approx(8.0));
  CHECK(rep["unaccounted_s"].get<double>() == doctest::Approx(1.0));  // 6 s .. 7 s
  CHECK(rep["largest_stage"] == "checkpoint_load");
  REQUIRE(rep["stages"].size() == 3);
  CHECK(rep["stages"][0]["stage"] == "environment");
  const auto& ck = rep["stages"][1];
  CHECK(ck["count"] == 2);
  CHECK(ck["busy_s"].get<double>() == doctest::Approx(4.0));
  CHECK(ck["max_s"].get<double>() == doctest::Approx(3.5));
  CHECK(ck["max_rank"] == 1);
  CHECK(ck["bytes"].get<uint64_t>() == (2ull << 30));
  CHECK(stage_report_text(rep).find("checkpoint_load") != std::string::npos);
}

TEST_CASE("a malformed stage log line is named by file, line and field") {
  TempDir d;
  std::string p = d / "bad.jsonl";
  startup_test::write_text(p, "{\"stage\":\"a\",\"start_ns\":1,\"end_ns\":2}\n\n{\"stage\":\"b\",\"start_ns\":5}\n");
  try {
    read_stages(p);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == p + ":3: field \"end_ns\" is missing");
  }
  startup_test::write_text(p, "{\"stage\":\"a\",\"start_ns\":9,\"end_ns\":2}\n");
  CHECK_THROWS_WITH_AS(read_stages(p), (p + ":1: field \"end_ns\" is before \"start_ns\"").c_str(), Error);
  startup_test::write_text(p, "not json\n");
  CHECK_THROWS_AS(read_stages(p), Error);
  CHECK_THROWS_WITH_AS(read_stages(d / "missing.jsonl"), doctest::Contains("No such file"), Error);
}

TEST_CASE("the stage log path comes from BALLAST_STARTUP_STAGES when not given") {
  TempDir d;
  ::setenv("BALLAST_STARTUP_STAGES", (d / "env.jsonl").c_str(), 1);
  StageLog log(nullptr, "");
  ::unsetenv("BALLAST_STARTUP_STAGES");
  StageRecord r;
  r.stage = "comm_init";
  r.start_ns = 1;
  r.end_ns = 2;
  log.record(r);
  auto got = read_stages(d / "env.jsonl");
  REQUIRE(got.size() == 1);
  CHECK(got[0].stage == "comm_init");
  CHECK(!got[0].node.empty());
}

TEST_CASE("crc32c and sha256 match published check values") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  uint32_t split = crc32c_update(crc32c("1234", 4), "56789", 5);
  CHECK(split == 0xE3069283u);
  // Large inputs take the three-lane path; pieces below 12 KiB the plain one.
  for (size_t n : {size_t(12288), size_t(100003), size_t(1 << 20) + 5}) {
    std::string data = startup_test::pattern(n, n);
    uint32_t pieces = 0;
    for (size_t off = 0; off < n; off += 1000)
      pieces = crc32c_update(pieces, data.data() + off, std::min<size_t>(1000, n - off));
    CHECK(crc32c(data.data(), n) == pieces);
    size_t cut = n / 3 + 1;
    CHECK(crc32c_combine(crc32c(data.data(), cut), crc32c(data.data() + cut, n - cut), n - cut) == pieces);
  }
  Sha256 h;
  h.update("abc", 3);
  CHECK(h.hex() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 e;
  CHECK(e.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}
