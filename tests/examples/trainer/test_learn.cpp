// The trainer learns, over 4 ranks under `ballast launch`, with its
// collectives traced.
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
}  // namespace

TEST_CASE("four ranks under ballast launch: the loss falls and every rank's collectives are traced") {
  const std::string dir = test::fresh_dir("learn");
  const auto r = launch(4, dir, "learn", {"--steps", "300", "--log-every", "100"});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  const Done d = parse_done(r.out);
  CHECK(d.step == 300);
  CHECK(d.first > 4.0);           // about ln(vocabulary) at the start
  CHECK(d.last < d.first - 1.2);  // bytes of English are far from uniform
  int rings = 0;
  for (const auto& e : fs::directory_iterator(dir + "/trace-learn")) rings += e.is_regular_file();
  CHECK(rings >= 4);
}
