// The `ballast` executable and the examples, run as real processes:
// run/stop on SIGINT, plugins (listed and refused), policy check, journal cat,
// the embedding C program and the Python ctypes trainer.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace fs = std::filesystem;

namespace {

const std::string kExe = BALLAST_EXE;
const std::string kSrc = BALLAST_SOURCE_DIR;
const std::string kBin = BALLAST_BINARY_DIR;

int sh(const std::string& command, std::string* out = nullptr) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  std::string text;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
  int status = pclose(p);
  if (out) *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

fs::path scratch() {
  fs::path dir = fs::temp_directory_path() / ("ballast-cli-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("ballast run with the default config loads the plugin and the policy and stops cleanly on SIGINT") {
  fs::path log = scratch() / "run.log";
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    execl(kExe.c_str(), "ballast", "run", (kSrc + "/examples/configs/default-agent.lua").c_str(), nullptr);
    _exit(127);
  }
  std::string text;
  for (int i = 0; i < 400 && !contains(text, "running on node"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    std::ifstream in(log);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  REQUIRE(contains(text, "running on node"));
  CHECK(contains(text, "loaded plugin hello"));
  CHECK(contains(text, "loaded policy"));
  kill(pid, SIGINT);
  int status = 0;
  for (int i = 0; i < 400 && waitpid(pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  if (waitpid(pid, &status, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL("ballast run did not stop within 10 s of SIGINT");
  }
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::ifstream in(log);
  text.assign(std::istreambuf_iterator<char>(in), {});
  CHECK(contains(text, "received SIGINT"));
  CHECK(contains(text, "stopped plugin hello"));
  CHECK(contains(text, "stopped cleanly"));
}

TEST_CASE("ballast run names the config file and line of a broken config") {
  fs::path config = scratch() / "broken.lua";
  std::ofstream(config) << "return {\n  plugins = {\n    oops oops\n}\n";
  std::string out;
  CHECK(sh(kExe + " run " + config.string(), &out) == 1);
  CHECK(contains(out, "broken.lua:3"));
}

TEST_CASE("ballast plugins lists the example plugin and refuses a broken one with the reason") {
  std::string out;
  CHECK(sh(kExe + " plugins " + kBin + "/lib/ballast/plugins/ballast-hello.so", &out) == 0);
  CHECK(contains(out, "hello"));
  CHECK(contains(out, "example"));
  CHECK(sh(kExe + " plugins --json " + kBin + "/lib/ballast/plugins/ballast-hello.so " + kBin +
               "/tests/loader-plugins/new_major.so",
           &out) == 1);
  CHECK(contains(out, "\"name\":\"hello\""));
  CHECK(contains(out, "abi_major is 2"));
}

TEST_CASE("ballast policy check replays JSON lines through the shipped default policy") {
  std::string out;
  int rc = sh(kExe + " policy check " + kSrc + "/scripts/default.lua --json --events " + kSrc +
                  "/tests/data/events/incident.jsonl",
              &out);
  CHECK(rc == 0);
  CHECK(contains(out, "\"action\""));
  CHECK(contains(out, "gpu017"));
}

TEST_CASE("ballast policy check names the line of a malformed event") {
  fs::path events = scratch() / "bad.jsonl";
  std::ofstream(events) << "{\"topic\":\"job.state\",\"payload\":{}}\n{\"topic\": 12}\n";
  std::string out;
  CHECK(sh(kExe + " policy check " + kSrc + "/scripts/default.lua --events " + events.string(), &out) == 1);
  CHECK(contains(out, "bad.jsonl:2"));
}

TEST_CASE("an upper-case topic is refused by policy check with the message ballast run gives") {
  const fs::path dir = scratch();
  const fs::path policy = dir / "upper.lua";
  std::ofstream(policy) << "ballast.on('Fault.Confirmed', function(ev) end)\n";
  const fs::path config = dir / "upper-config.lua";
  std::ofstream(config) << "return { policy = '" << policy.string() << "' }\n";
  const std::string message = "upper.lua:1: ballast.on: \"Fault.Confirmed\" is not a valid pattern";
  std::string check_out, run_out;
  CHECK(sh(kExe + " policy check " + policy.string(), &check_out) == 1);
  CHECK(sh(kExe + " run " + config.string(), &run_out) == 1);
  INFO(check_out);
  INFO(run_out);
  CHECK(contains(check_out, message));
  CHECK(contains(run_out, message));
}

TEST_CASE("ballast policy check fails when the policy fails") {
  fs::path policy = scratch() / "fails.lua";
  std::ofstream(policy) << "ballast.on('fault.*', function(ev) error('boom') end)\n";
  std::string out;
  CHECK(sh(kExe + " policy check " + policy.string() + " --events " + kSrc + "/tests/data/events/incident.jsonl",
           &out) == 1);
  CHECK(contains(out, "boom"));
  CHECK(contains(out, "fallback"));
}

TEST_CASE("ballast journal cat prints a journal written by ballast run, and reports a corrupted one") {
  fs::path dir = scratch();
  fs::path journal = dir / "run.journal";
  fs::path config = dir / "journal.lua";
  std::ofstream(config) << "return { journal = '" << journal.string() << "', plugins = { { path = '" << kBin
                        << "/lib/ballast/plugins/ballast-hello.so', config = { period_ms = 10 } } } }\n";
  pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::freopen("/dev/null", "w", stderr);
    (void)f;
    execl(kExe.c_str(), "ballast", "run", config.c_str(), nullptr);
    _exit(127);
  }
  // SIGTERM once the host runs (its journal has events), not before it
  // handles the signal: a slow start (ASan, a loaded machine) is not the test.
  for (int i = 0; i < 600; ++i) {
    std::error_code ec;
    if (fs::exists(journal, ec) && fs::file_size(journal, ec) > 256) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  std::string out;
  REQUIRE(sh(kExe + " journal cat --json " + journal.string(), &out) == 0);
  CHECK(contains(out, "hello.tick"));

  // Flip one byte in the middle: that frame is reported with its offset.
  auto size = fs::file_size(journal);
  {
    std::fstream f(journal, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    char c;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(size / 2));
    c = static_cast<char>(c ^ 0x55);
    f.write(&c, 1);
  }
  CHECK(sh(kExe + " journal cat " + journal.string(), &out) == 1);
  CHECK(contains(out, "byte "));
}

TEST_CASE("an unknown command is a usage error that lists the plugin commands") {
  std::string out;
  CHECK(sh(kExe + " no-such-command", &out) == 2);
  CHECK(contains(out, "unknown command"));
}

TEST_CASE("examples/embed: a C program hosts Ballast and gets the policy's action") {
  std::string out;
  CHECK(sh(kBin + "/bin/ballast-embed-example " + kBin + "/lib/ballast/plugins/ballast-hello.so " + kSrc +
               "/scripts/default.lua",
           &out) == 0);
  CHECK(contains(out, "recovery.action"));
  CHECK(contains(out, "hello.seen"));
}

TEST_CASE("examples/python: a ctypes training loop publishes step timings and obeys the policy") {
  REQUIRE_MESSAGE(sh("python3 --version") == 0, "python3 not found (tools/install-deps installs it)");
  std::string out;
  std::string env;
#if defined(__SANITIZE_ADDRESS__)
  // libballast carries the ASan runtime: it must be loaded first, and
  // CPython's own allocations at exit are not ours to report.
  std::string asan;
  sh("gcc -print-file-name=libasan.so", &asan);
  while (!asan.empty() && asan.back() == '\n') asan.pop_back();
  env = "LD_PRELOAD=" + asan + " ASAN_OPTIONS=detect_leaks=0 ";
#endif
  int rc = sh(env + "python3 " + kSrc + "/examples/python/train.py --lib " + kBin + "/lib/libballast.so --policy " +
                  kSrc + "/examples/python/slow_step_policy.lua --steps 60 --slow-from 20 --step-ms 20",
              &out);
  CHECK(rc == 0);
  CHECK(contains(out, "checkpoint_now"));
  CHECK(contains(out, "pause"));
}
