// End to end: the real `ballast` executable finds the plugin's command.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "helpers.hpp"

using startup_test::TempDir;
using startup_test::write_text;

namespace {

struct Result {
  int rc;
  std::string out;
};

Result ballast(const std::string& args) {
  std::string cmd = std::string(BALLAST_EXE) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128, out};
}

std::string le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(char(v >> (8 * i)));
  return s;
}

}  // namespace

TEST_CASE("ballast --help lists the startup command") {
  Result r = ballast("--help");
  CHECK(r.out.find("startup") != std::string::npos);
}

TEST_CASE("ballast startup load, time and report run through the real executable") {
  TempDir d;
  std::string h = R"({"x":{"dtype":"U8","shape":[4096],"data_offsets":[0,4096]}})";
  write_text(d / "m.safetensors", le64(h.size()) + h + startup_test::pattern(4096, 1));
  std::string stages = d / "s.jsonl";
  Result l = ballast("startup load " + (d / "m.safetensors") + " --json --stripes 2 --stages " + stages);
  REQUIRE(l.rc == 0);
  auto j = nlohmann::json::parse(l.out);
  CHECK(j["tensors"] == 1);
  CHECK(j["bytes"] == 8 + h.size() + 4096);
  CHECK(j["mapped"] == true);  // the default: into the page cache, mapped
  Result direct = ballast("startup load " + (d / "m.safetensors") + " --json --direct");
  REQUIRE(direct.rc == 0);
  auto jd = nlohmann::json::parse(direct.out);
  CHECK(jd["mapped"] == false);
  CHECK(jd["checksum"] == j["checksum"]);
  REQUIRE(ballast("startup time comm_init --stages " + stages + " -- true").rc == 0);
  Result r = ballast("startup report --json " + stages);
  REQUIRE(r.rc == 0);
  auto rep = nlohmann::json::parse(r.out);
  CHECK(rep["records"] == 2);
  CHECK(rep["stages"][0]["stage"] == "checkpoint_load");
  Result bad = ballast("startup load " + (d / "missing.safetensors"));
  CHECK(bad.rc == 1);
  CHECK(bad.out.find("missing.safetensors: No such file or directory") != std::string::npos);
}
