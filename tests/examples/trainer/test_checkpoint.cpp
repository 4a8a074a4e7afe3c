// Checkpoints: safetensors that the start-up plugin's loader (`ballast
// startup load`) and an independent reading accept, never seen half written
// under their final name, and bad ones refused with the file and the reason.
#include <doctest/doctest.h>

#include "trainer_run.hpp"

#include <atomic>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

// Reads a safetensors file as the format says; "" when complete and
// consistent, else what is wrong.
std::string check_safetensors(const std::string& path, nlohmann::json* header_out = nullptr) {
  const std::string bytes = test::slurp(path);
  if (bytes.size() < 8) return "shorter than 8 bytes";
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  if (8 + n > bytes.size()) return "header runs past the end";
  const auto header = nlohmann::json::parse(bytes.substr(8, n), nullptr, false);
  if (!header.is_object()) return "header is not JSON";
  std::set<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    uint64_t count = 4;
    for (const auto& d : t["shape"]) count *= d.get<uint64_t>();
    const uint64_t b = t["data_offsets"][0], e = t["data_offsets"][1];
    if (t["dtype"] != "F32" || e - b != count) return name + ": size does not match its shape";
    spans.insert({b, e});
  }
  uint64_t at = 0;
  for (const auto& [b, e] : spans) {
    if (b != at) return "tensors do not tile the data";
    at = e;
  }
  if (8 + n + at != bytes.size()) return "file size is not header + data";
  if (header_out) *header_out = header;
  return "";
}

}  // namespace

TEST_CASE("a checkpoint is a complete safetensors file that the start-up plugin's loader reads") {
  const std::string dir = test::fresh_dir("load");
  const auto r = test::trainer({"--steps", "20", "--checkpoint-every", "10", "--checkpoint-dir", dir}, dir);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const std::string file = dir + "/step-00000020.safetensors";
  nlohmann::json header;
  REQUIRE(check_safetensors(file, &header) == "");
  const auto& meta = header["__metadata__"];
  CHECK(meta["step"] == "20");
  CHECK(meta["seed"] == "1");
  CHECK(meta["world_size"] == "1");
  for (const char* t : {"embedding", "hidden.weight", "hidden.bias", "output.weight", "output.bias",
                        "adam.m.hidden.weight", "adam.v.output.bias"})
    CHECK(header.contains(t));
  const auto load = test::finish(test::start({test::kBallast, "startup", "load", file, "--json"}, {}, dir, "load"));
  INFO(load.out << load.err);
  CHECK(load.code == 0);
  CHECK(load.out.find("\"tensors\":15") != std::string::npos);
  CHECK(fs::exists(dir + "/step-00000010.safetensors"));
}

TEST_CASE("a checkpoint under its final name is always complete, and no temporary file stays") {
  const std::string dir = test::fresh_dir("atomic");
  // Wider layers make each write take longer, so that a watcher would catch a
  // file written in place.
  const auto p = test::start(
      {test::kTrainer, "--steps", "30", "--checkpoint-every", "1", "--hidden", "512", "--checkpoint-dir", dir},
      {{"RANK", ""}, {"BALLAST_JOB_SOCKET", ""}, {"BALLAST_CONTROL_FILE", ""}, {"BALLAST_TRACE_DIR", dir}}, dir,
      "trainer");
  std::set<std::string> seen;
  std::string bad;
  int looks = 0;
  while (waitpid(p.pid, nullptr, WNOHANG) == 0 && bad.empty()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename();
      if (name.rfind("step-", 0) != 0 || name.find(".safetensors") == std::string::npos || seen.count(name)) continue;
      const std::string why = check_safetensors(e.path());
      if (!why.empty()) bad = name + ": " + why;
      seen.insert(name);
      ++looks;
    }
  }
  const auto r = test::finish(p);
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK(bad == "");
  CHECK(looks > 0);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename();
    CHECK_MESSAGE(name.find(".tmp") == std::string::npos, name);
    files += name.rfind("step-", 0) == 0;
  }
  CHECK(files == 30);
}

TEST_CASE("bad checkpoints are refused with the file and the reason") {
  // One good checkpoint for every subcase (doctest runs the case's body once per subcase).
  static const std::string dir = test::fresh_dir("bad");
  static const int made = test::trainer({"--steps", "5", "--checkpoint-dir", dir}, dir).code;
  REQUIRE(made == 0);
  const std::string file = dir + "/step-00000005.safetensors";

  SUBCASE("missing") {
    const auto r = test::trainer({"--steps", "10", "--resume-from", dir + "/nothing.safetensors"}, dir);
    CHECK(r.code == 2);
    CHECK(r.err.find(dir + "/nothing.safetensors") != std::string::npos);
  }
  SUBCASE("not safetensors") {
    std::ofstream(dir + "/junk.safetensors") << "this is not a checkpoint at all";
    const auto r = test::trainer({"--steps", "10", "--resume-from", dir + "/junk.safetensors"}, dir);
    CHECK(r.code == 2);
    CHECK(r.err.find("junk.safetensors") != std::string::npos);
  }
  SUBCASE("truncated") {
    const std::string bytes = test::slurp(file);
    std::ofstream(dir + "/cut.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    const auto r = test::trainer({"--steps", "10", "--resume-from", dir + "/cut.safetensors"}, dir);
    CHECK(r.code == 2);
    CHECK(r.err.find("cut.safetensors") != std::string::npos);
  }
  SUBCASE("another model's") {
    const auto r = test::trainer({"--steps", "10", "--hidden", "64", "--resume-from", file}, dir);
    CHECK(r.code == 2);
    CHECK(r.err.find("hidden is 128, this run has 64") != std::string::npos);
  }
  SUBCASE("another text's") {
    std::ofstream(dir + "/digits.txt") << "0123456789012345678901234567890123456789";
    const auto r = test::trainer({"--steps", "10", "--data", dir + "/digits.txt", "--resume-from", file}, dir);
    CHECK(r.code == 2);
    CHECK(r.err.find("another vocabulary") != std::string::npos);
  }
  SUBCASE("a safetensors file that is not this trainer's") {
    const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
    bytes += header + std::string(4, '\0');
    std::ofstream(dir + "/foreign.safetensors", std::ios::binary) << bytes;
    const auto r = test::trainer({"--steps", "10", "--resume-from", dir + "/foreign.safetensors"}, dir);
    CHECK(r.code == 2);
    CHECK(r.err.find("no __metadata__") != std::string::npos);
  }
}
