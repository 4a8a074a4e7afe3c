// The trainer is deterministic: the same seed and world size give the same
// bytes, also across a resume from a checkpoint.
#include <doctest/doctest.h>

#include "trainer_run.hpp"

#include <regex>

namespace fs = std::filesystem;

namespace {

// "done: step S, loss A -> B" of rank 0.
struct Done {
  int step = 0;
  double first = 0, last = 0;
};
Done parse_done(const std::string& out) {
  std::smatch m;
  Done d;
  if (std::regex_search(out, m, std::regex(R"(done: step (\d+), loss ([0-9.]+) -> ([0-9.]+))"))) {
    d.step = std::stoi(m[1]);
    d.first = std::stod(m[2]);
    d.last = std::stod(m[3]);
  }
  return d;
}

test::Result launch(int ranks, const std::string& dir, const std::string& tag, const std::vector<std::string>& args) {
  fs::create_directories(dir + "/trace-" + tag);
  return test::finish(
      test::start(test::launch_argv(ranks, dir + "/trace-" + tag, args), {{"BALLAST_CHECKPOINT_DIR", ""}}, dir, tag),
      240);
}

bool same_bytes(const std::string& a, const std::string& b) {
  const std::string x = test::slurp(a), y = test::slurp(b);
  return !x.empty() && x == y;
}

}  // namespace

TEST_CASE("200 steps equal 100 steps, a resume from the checkpoint and 100 more, bit for bit") {
  const std::string dir = test::fresh_dir("resume");
  const std::string whole = dir + "/whole", split = dir + "/split";
  fs::create_directories(whole);
  fs::create_directories(split);
  // 2 ranks and a narrower layer: the same all-reduce and optimiser, at a
  // cost that suits a sanitizer build on a loaded machine.
  const std::vector<std::string> model = {"--hidden", "64", "--log-every", "100"};
  auto args = [&](std::vector<std::string> a) {
    a.insert(a.end(), model.begin(), model.end());
    return a;
  };
  const auto a =
      launch(2, dir, "whole", args({"--steps", "200", "--checkpoint-every", "100", "--checkpoint-dir", whole}));
  INFO("whole: " << a.out << a.err);
  REQUIRE(a.code == 0);
  const auto b = launch(2, dir, "first", args({"--steps", "100", "--checkpoint-dir", split}));
  INFO("first half: " << b.out << b.err);
  REQUIRE(b.code == 0);
  const auto c = launch(
      2, dir, "second",
      args({"--steps", "200", "--checkpoint-dir", split, "--resume-from", split + "/step-00000100.safetensors"}));
  INFO("second half: " << c.out << c.err);
  REQUIRE(c.code == 0);
  CHECK(same_bytes(whole + "/step-00000100.safetensors", split + "/step-00000100.safetensors"));
  CHECK(same_bytes(whole + "/step-00000200.safetensors", split + "/step-00000200.safetensors"));
  CHECK(parse_done(a.out).last == parse_done(c.out).last);

  // Another seed gives other weights: the comparison above can fail.
  const std::string other = dir + "/other";
  fs::create_directories(other);
  const auto d = launch(2, dir, "other", args({"--steps", "100", "--seed", "2", "--checkpoint-dir", other}));
  REQUIRE(d.code == 0);
  CHECK_FALSE(same_bytes(other + "/step-00000100.safetensors", split + "/step-00000100.safetensors"));
}
