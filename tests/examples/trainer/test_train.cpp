// The trainer learns, over 4 ranks under `ballast launch`, with its
// collectives traced; and it is deterministic: the same seed and world size
// give the same bytes, also across a resume from a checkpoint.
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
  return test::finish(test::start(test::launch_argv(ranks, dir + "/trace-" + tag, args), {{"BALLAST_CHECKPOINT_DIR", ""}},
                                  dir, tag),
                      240);
}

bool same_bytes(const std::string& a, const std::string& b) {
  const std::string x = test::slurp(a), y = test::slurp(b);
  return !x.empty() && x == y;
}

}  // namespace

TEST_CASE("four ranks under ballast launch: the loss falls and every rank's collectives are traced") {
  const std::string dir = test::fresh_dir("learn");
  const auto r = launch(4, dir, "learn", {"--steps", "300", "--log-every", "100"});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  const Done d = parse_done(r.out);
  CHECK(d.step == 300);
  CHECK(d.first > 4.0);          // about ln(vocabulary) at the start
  CHECK(d.last < d.first - 1.2);  // bytes of English are far from uniform
  int rings = 0;
  for (const auto& e : fs::directory_iterator(dir + "/trace-learn")) rings += e.is_regular_file();
  CHECK(rings >= 4);
}

TEST_CASE("200 steps equal 100 steps, a resume from the checkpoint and 100 more, bit for bit") {
  const std::string dir = test::fresh_dir("resume");
  const std::string whole = dir + "/whole", split = dir + "/split";
  fs::create_directories(whole);
  fs::create_directories(split);
  const auto a = launch(4, dir, "whole", {"--steps", "200", "--checkpoint-every", "100", "--checkpoint-dir", whole});
  INFO("whole: " << a.out << a.err);
  REQUIRE(a.code == 0);
  const auto b = launch(4, dir, "first", {"--steps", "100", "--checkpoint-dir", split});
  INFO("first half: " << b.out << b.err);
  REQUIRE(b.code == 0);
  const auto c = launch(4, dir, "second",
                        {"--steps", "200", "--checkpoint-dir", split, "--resume-from", split + "/step-00000100.safetensors"});
  INFO("second half: " << c.out << c.err);
  REQUIRE(c.code == 0);
  CHECK(same_bytes(whole + "/step-00000100.safetensors", split + "/step-00000100.safetensors"));
  CHECK(same_bytes(whole + "/step-00000200.safetensors", split + "/step-00000200.safetensors"));
  CHECK(parse_done(a.out).last == parse_done(c.out).last);

  // Another seed gives other weights: the comparison above can fail.
  const std::string other = dir + "/other";
  fs::create_directories(other);
  const auto d = launch(4, dir, "other", {"--steps", "100", "--seed", "2", "--checkpoint-dir", other});
  REQUIRE(d.code == 0);
  CHECK_FALSE(same_bytes(other + "/step-00000100.safetensors", split + "/step-00000100.safetensors"));
}
