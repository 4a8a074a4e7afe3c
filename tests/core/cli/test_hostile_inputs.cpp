// The `ballast` built-in commands on hostile input: JSON nested 100,000
// deep, invalid UTF-8 in what a policy returns, and config numbers that
// would wrap. Each ends in a clear error or correct output, never a crash.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace fs = std::filesystem;

namespace {

const std::string kExe = BALLAST_EXE;

// Runs `command` with stderr merged; the exit code, 128+N for a signal.
int sh(const std::string& command, std::string* out) {
  FILE* p = popen(("exec 2>&1; " + command).c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  out->clear();
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out->append(buf.data(), n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("ballast-hostile-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

const char* kPolicy = "ballast.on('fault.confirmed', function(ev) return {action = 'restart'} end)\n";

const std::string kHello = std::string(BALLAST_PLUGIN_DIR) + "/ballast-hello.so";

// `ballast run CONFIG` with stderr to `log`; with file_limit > 0, under
// RLIMIT_FSIZE (SIGXFSZ ignored: writes past it fail with EFBIG, as on a
// full disk).
pid_t start_run(const fs::path& config, const fs::path& log, rlim_t file_limit = 0) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (file_limit > 0) {
      signal(SIGXFSZ, SIG_IGN);
      rlimit lim{file_limit, file_limit};
      setrlimit(RLIMIT_FSIZE, &lim);
    }
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    execl(kExe.c_str(), "ballast", "run", config.c_str(), nullptr);
    _exit(127);
  }
  return pid;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Wait until `log` contains `what` (up to 20 s).
bool wait_for_log(const fs::path& log, const std::string& what) {
  for (int i = 0; i < 800; ++i) {
    if (contains(read_file(log), what)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

// The exit code (128+N for a signal), or -1 if still running after `seconds`
// (then killed).
int wait_exit(pid_t pid, int seconds) {
  for (int i = 0; i < seconds * 20; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

}  // namespace

TEST_CASE("an event line nested 100,000 deep is refused with its file and line") {
  const fs::path policy = scratch("p.lua"), events = scratch("deep.jsonl");
  std::ofstream(policy) << kPolicy;
  std::ofstream(events) << "{\"topic\":\"job.state\"}\n{\"topic\":\"x.y\",\"payload\":" << std::string(100000, '[')
                        << std::string(100000, ']') << "}\n";
  std::string out;
  CHECK(sh(kExe + " policy check " + policy.string() + " --json --events " + events.string(), &out) == 1);
  CHECK_MESSAGE(contains(out, "deep.jsonl:2: JSON nested deeper than 128 levels"), out);
}

TEST_CASE("a policy action and error message with invalid UTF-8 are printed under --json, not aborted on") {
  const fs::path policy = scratch("utf8.lua"), events = scratch("one.jsonl");
  std::ofstream(policy) << "ballast.on('fault.confirmed', function(ev)\n"
                           "  return {action = 'restart', subject = 'gpu\\xff', reason = 'bad \\xfe byte'}\n"
                           "end)\n"
                           "ballast.on('job.state', function(ev) error('broken \\xff') end)\n";
  std::ofstream(events) << "{\"topic\":\"fault.confirmed\",\"payload\":{\"subject\":\"gpu1\"}}\n"
                           "{\"topic\":\"job.state\"}\n";
  std::string out;
  // 1: the policy failed on one event; not 134 (an uncaught JSON exception).
  CHECK(sh(kExe + " policy check " + policy.string() + " --json --events " + events.string(), &out) == 1);
  CHECK_MESSAGE(contains(out, "\"subject\":\"gpu\xEF\xBF\xBD\""), out);
  CHECK_MESSAGE(contains(out, "policy error"), out);
}

TEST_CASE("policy limits that would wrap are refused, naming the field") {
  const fs::path policy = scratch("limits.lua");
  std::ofstream(policy) << kPolicy;
  for (const auto& [field, value] : {std::pair<std::string, std::string>{"memory_mb", "17592186044417"},
                                     {"deadline_ms", "4294967297"},
                                     {"memory_mb", "1e300"},
                                     {"deadline_ms", "2.5"}}) {
    CAPTURE(field);
    CAPTURE(value);
    const fs::path config = scratch("limits-config.lua");
    std::ofstream(config) << "return { policy = { script = '" << policy.string() << "', " << field << " = " << value
                          << " } }\n";
    std::string out;
    CHECK(sh(kExe + " run " + config.string(), &out) == 1);
    CHECK_MESSAGE(contains(out, "config field '" + field + "': expected a whole number from 0 to"), out);
  }
}

TEST_CASE("ballast run stops on SIGINT while its policy is stuck in a handler with a one-hour deadline") {
  for (const std::string body :
       {"while true do end", "local s = string.rep('a', 40) string.find(s, string.rep('a?', 40) .. s)",
        "local s = string.rep('a', 1e7) local t = {} for i = 1, 1e5 do t[i] = s end table.sort(t)"}) {
    CAPTURE(body);
    const fs::path policy = scratch("stuck.lua");
    std::ofstream(policy) << "ballast.on('hello.tick', function(ev) " << body << " end)\n";
    const fs::path config = scratch("stuck-config.lua");
    std::ofstream(config) << "return { policy = { script = '" << policy.string()
                          << "', deadline_ms = 3600000, memory_mb = 256 }, plugins = { { path = '" << kHello
                          << "', config = { period_ms = 5 } } } }\n";
    const fs::path log = scratch("stuck.log");
    fs::remove(log);  // not the previous body's: it says "running on node" already
    pid_t pid = start_run(config, log);
    REQUIRE(wait_for_log(log, "running on node"));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the first tick is in the handler
    kill(pid, SIGHUP);                                            // the reload waits for the stuck handler...
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(pid, SIGINT);  // ...and gives up: the host stops
    const int rc = wait_exit(pid, 60);
    const std::string text = read_file(log);
    CHECK_MESSAGE(rc == 0, text);
    CHECK_MESSAGE(contains(text, "interrupted"), text);
    CHECK_MESSAGE(contains(text, "stopped cleanly"), text);
  }
}

TEST_CASE("a journal that cannot be written (a full disk) is counted and reported, with a non-zero exit") {
  const fs::path journal = scratch("full.journal");
  fs::remove(journal);
  const fs::path config = scratch("full-config.lua");
  std::ofstream(config) << "return { journal = '" << journal.string() << "', plugins = { { path = '" << kHello
                        << "', config = { period_ms = 1 } } } }\n";
  const fs::path log = scratch("full.log");
  fs::remove(log);
  pid_t pid = start_run(config, log, 16384);
  REQUIRE(wait_for_log(log, "event(s) not written so far"));
  kill(pid, SIGTERM);
  const int rc = wait_exit(pid, 60);
  const std::string text = read_file(log);
  CHECK_MESSAGE(rc == 1, text);
  CHECK_MESSAGE(contains(text, "File too large"), text);
  CHECK_MESSAGE(contains(text, "the journal lost"), text);
  CHECK_FALSE(contains(text, "stopped cleanly"));
  // What was written is whole frames: the journal reads back without a problem.
  CHECK(fs::file_size(journal) <= 16384);
  std::string out;
  CHECK(sh(kExe + " journal cat " + journal.string() + " > /dev/null", &out) == 0);
  CHECK_MESSAGE(contains(out, " 0 bad frame(s)"), out);
}
