// The job's checkpoints on disk: found by step, and pruned to the newest N
// without losing the one a rollback past a NaN needs.
#include <doctest/doctest.h>

#include "checkpoints.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

using namespace ballast::runner;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  const fs::path dir = fs::path(tmp ? tmp : "/tmp") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void write_checkpoint(const std::string& dir, int step) {
  char name[64];
  std::snprintf(name, sizeof name, "/step-%08d.safetensors", step);
  std::ofstream(dir + name) << step;
}

bool has(const std::string& dir, int step) {
  char name[64];
  std::snprintf(name, sizeof name, "/step-%08d.safetensors", step);
  return fs::exists(dir + name);
}

}  // namespace

TEST_CASE("checkpoints are listed oldest first and found by step; other files are not checkpoints") {
  const std::string dir = fresh_dir("ckpt-list");
  for (int s : {20, 5, 10}) write_checkpoint(dir, s);
  std::ofstream(dir + "/step-00000030.safetensors.tmp") << "partial";
  std::ofstream(dir + "/step-0000004x.safetensors") << "odd";
  const auto all = list_checkpoints(dir);
  REQUIRE(all.size() == 3);
  CHECK(all[0].step == 5);
  CHECK(all[2].step == 20);
  CHECK(find_checkpoint(dir, -1).step == 20);
  CHECK(find_checkpoint(dir, 19).step == 10);
  CHECK(find_checkpoint(dir, 4).path.empty());
}

TEST_CASE("pruning keeps the newest N, and the newest before a NaN step") {
  const std::string dir = fresh_dir("ckpt-prune");
  for (int s = 10; s <= 80; s += 10) write_checkpoint(dir, s);
  CHECK(prune_checkpoints(dir, 0, -1).empty());  // 0: keep all
  CHECK(list_checkpoints(dir).size() == 8);

  // A NaN at step 33: the rollback needs step 30.
  const auto removed = prune_checkpoints(dir, 3, 33);
  CHECK(removed.size() == 4);
  for (int s : {30, 60, 70, 80}) CHECK_MESSAGE(has(dir, s), "step " << s);
  for (int s : {10, 20, 40, 50}) CHECK_MESSAGE(!has(dir, s), "step " << s);

  // No NaN: only the newest three.
  CHECK(prune_checkpoints(dir, 3, -1).size() == 1);
  CHECK(!has(dir, 30));
  CHECK(list_checkpoints(dir).size() == 3);
}
