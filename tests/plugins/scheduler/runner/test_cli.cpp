// `ballast run` refuses bad job input before anything runs: an unknown
// fault kind, a rank out of range, a schedule line that is not JSON, a
// trainer that does not exist; each error names the argument or the line,
// and the exit code is not 0.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace {

std::string scratch() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp ? tmp : "/tmp";
}

struct Result {
  int code = -1;
  std::string output;
};

Result run(const std::string& args) {
  Result r;
  const std::string cmd = std::string(BALLAST_EXE) + " run " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) r.output.append(buf.data(), n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string config(const std::string& command) {
  const std::string path = scratch() + "/job.lua";
  std::ofstream(path) << "return { job = { command = {" << command << ", '--steps', '5'}, ranks = 4, dir = '"
                      << scratch() << "/job' }, policy = { script = '" BALLAST_SOURCE_DIR "/scripts/default.lua' } }\n";
  return path;
}

const std::string kTrainer = "'" BALLAST_SOURCE_DIR "/tests/plugins/scheduler/runner/channel_trainer.py'";

}  // namespace

TEST_CASE("an unknown --inject kind is refused, naming the argument") {
  auto r = run(config(kTrainer) + " --inject 'boom:rank=1@2'");
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(r.output.find("--inject 'boom:rank=1@2': unknown fault kind 'boom'") != std::string::npos);
  // The runner fails to create, which stops `ballast run` (a required plugin).
  CHECK(r.output.find("plugin runner") != std::string::npos);
}

TEST_CASE("a rank out of range is refused") {
  auto r = run(config(kTrainer) + " --inject 'crash:rank=4@2'");
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(r.output.find("--inject 'crash:rank=4@2': rank 4 is out of range (the job has 4 ranks: 0-3)") !=
        std::string::npos);
}

TEST_CASE("a schedule line that is not JSON is refused, naming the file and line") {
  const std::string sched = scratch() + "/bad.jsonl";
  std::ofstream(sched) << "{\"spec\": \"crash:rank=1@5\"}\n{crash: 1}\n";
  auto r = run(config(kTrainer) + " --inject-schedule " + sched);
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(r.output.find(sched + ":2: not JSON") != std::string::npos);
}

TEST_CASE("a trainer command that does not exist is refused") {
  auto r = run(config("'no-such-trainer-ballast'"));
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(r.output.find("job.command[1]: 'no-such-trainer-ballast' is not found in PATH or beside") != std::string::npos);
  auto r2 = run(config("'./missing/trainer'"));
  CHECK(r2.code != 0);
  CHECK(r2.output.find("job.command[1]: './missing/trainer' does not exist or is not executable") != std::string::npos);
}

TEST_CASE("--inject without a job in the config is refused") {
  const std::string path = scratch() + "/nojob.lua";
  std::ofstream(path) << "return { plugins = {} }\n";
  auto r = run(path + " --inject 'crash:rank=0@1'");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("need a config with a job") != std::string::npos);
}

TEST_CASE("machine kind=net without job.netns, and a job.netns that is not a choice, are refused") {
  auto r = run(config(kTrainer) + " --inject 'machine:node=1,kind=net@2'");
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(r.output.find("--inject 'machine:node=1,kind=net@2': machine kind=net needs a network namespace per node: "
                      "set job.netns = true or \"auto\"") != std::string::npos);
  const std::string path = scratch() + "/netns.lua";
  std::ofstream(path) << "return { job = { command = {" << kTrainer << "}, ranks = 2, netns = 'yes' } }\n";
  auto r2 = run(path);
  INFO(r2.output);
  CHECK(r2.code != 0);
  CHECK(r2.output.find("job.netns: want true, false or \"auto\", got \"yes\"") != std::string::npos);
}
