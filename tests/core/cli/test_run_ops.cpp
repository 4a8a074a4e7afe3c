// `ballast run` as the people who run it meet it, as a real process: a typo
// in the config stops it with the key and the file named; SIGUSR1 and SIGUSR2
// (Slurm's --signal) write the counters instead of killing it; /metrics
// answers a real HTTP client; the log level comes from --log-level, else
// BALLAST_LOG_LEVEL, else the config; --log-format json writes JSON lines;
// `ballast run --help` names only files that exist.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

const std::string kExe = BALLAST_EXE;
const std::string kSrc = BALLAST_SOURCE_DIR;

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

fs::path scratch() {
  fs::path dir = fs::temp_directory_path() / ("ballast-run-ops-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir;
}

std::string write(const std::string& name, const std::string& text) {
  const fs::path p = scratch() / name;
  std::ofstream(p) << text;
  return p.string();
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int sh(const std::string& command, std::string* out) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  std::string text;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
  const int status = pclose(p);
  *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// `ballast run ARGS...` in the background, its stderr in a file.
struct Run {
  pid_t pid = -1;
  fs::path log;

  Run(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    static int n = 0;
    log = scratch() / ("run" + std::to_string(n++) + ".log");
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      FILE* f = std::freopen(log.c_str(), "w", stderr);
      (void)f;
      for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv{const_cast<char*>("ballast"), const_cast<char*>("run")};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(kExe.c_str(), argv.data());
      _exit(127);
    }
  }
  ~Run() {
    if (pid > 0 && waitpid(pid, nullptr, WNOHANG) == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  // The log once it holds `what` (at most 30 s), else what it holds.
  std::string wait_for(const std::string& what) const {
    std::string text;
    for (int i = 0; i < 1200 && !has(text, what); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
      text = slurp(log);
    }
    return text;
  }
  // Whether ballast handles SIGINT (its run loop is up), at most 30 s: for
  // a run that logs nothing to wait for. Before the exec the child is this
  // test (doctest's handlers), so the name must be ballast's first.
  bool wait_handles_sigint() const {
    for (int i = 0; i < 1200; ++i) {
      std::ifstream status("/proc/" + std::to_string(pid) + "/status");
      bool exec_done = false;
      for (std::string line; std::getline(status, line);) {
        if (line.rfind("Name:", 0) == 0) exec_done = line.find("ballast") != std::string::npos;
        if (exec_done && line.rfind("SigCgt:", 0) == 0 &&
            (std::stoull(line.substr(7), nullptr, 16) & (1ull << (SIGINT - 1))))
          return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  }
  // The exit code after SIGINT (-1: killed by a signal or still running after 30 s).
  int stop() {
    kill(pid, SIGINT);
    int status = 0;
    for (int i = 0; i < 1200; ++i) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return -1;
  }
};

const char* kReady = "running on node";

}  // namespace

TEST_CASE("a typo in the config stops ballast run with the key and the file named") {
  const std::string config = write("typo.lua", "return { polcy = 'default.lua' }\n");
  std::string out;
  CHECK(sh(kExe + " run " + config, &out) == 1);
  CHECK(has(out, config));
  CHECK(has(out, "unknown key 'polcy' (did you mean 'policy'?)"));

  const std::string plugin_typo =
      write("plugin-typo.lua", "return { plugins = { { path = 'hello', config = { greting = 'hi' } } } }\n");
  CHECK(sh(kExe + " run " + plugin_typo, &out) == 1);
  CHECK(has(out, plugin_typo));
  CHECK(has(out, "unknown config key 'greting' (did you mean 'greeting'?)"));

  const std::string missing = write("missing.lua", "return { plugins = { 'no-such-plugin' } }\n");
  CHECK(sh(kExe + " run " + missing, &out) == 1);
  CHECK(has(out, "no-such-plugin"));
}

TEST_CASE("SIGUSR1 and SIGUSR2 write the counters to the log; the host runs on; /metrics answers curl") {
  const std::string config =
      write("signals.lua", "return { node = 'ops-node', plugins = {}, metrics = { listen = '127.0.0.1:0' } }\n");
  Run run({config});
  std::string text = run.wait_for(kReady);
  REQUIRE(has(text, kReady));
  std::smatch m;
  REQUIRE(std::regex_search(text, m, std::regex("serving metrics at (http://127\\.0\\.0\\.1:[0-9]+/metrics)")));
  const std::string url = m[1];

  kill(run.pid, SIGUSR1);
  text = run.wait_for("received SIGUSR1: counters");
  CHECK(has(text, "received SIGUSR1: counters bus.delivered="));
  kill(run.pid, SIGUSR2);
  text = run.wait_for("received SIGUSR2: counters");
  CHECK(has(text, "received SIGUSR2: counters"));
  CHECK(waitpid(run.pid, nullptr, WNOHANG) == 0);  // still running

  std::string body;
  REQUIRE(sh("curl -sS --max-time 20 " + url, &body) == 0);
  CHECK(has(body, "# TYPE ballast_bus_published_total counter"));
  CHECK(has(body, "ballast_host_info{node=\"ops-node\"} 1"));
  // The two host.signal events were published.
  std::smatch published;
  REQUIRE(std::regex_search(body, published, std::regex("ballast_bus_published_total ([0-9]+)")));
  CHECK(std::stoi(published[1]) >= 2);

  CHECK(run.stop() == 0);
  CHECK(has(slurp(run.log), "stopped cleanly"));
}

TEST_CASE("the log level: --log-level, else BALLAST_LOG_LEVEL, else the config; JSON lines with --log-format json") {
  const std::string config = write("quiet.lua", "return { log_level = 'info', plugins = {} }\n");
  {
    Run run({config}, {"BALLAST_LOG_LEVEL=warn"});
    REQUIRE(run.wait_handles_sigint());  // nothing at info to wait for
    CHECK(run.stop() == 0);
    const std::string text = slurp(run.log);
    CHECK_FALSE(has(text, kReady));
    CHECK(has(text, "stopped cleanly"));
  }
  {
    Run run({config, "--log-level", "debug"}, {"BALLAST_LOG_LEVEL=warn"});
    CHECK(has(run.wait_for(kReady), kReady));
    CHECK(run.stop() == 0);
  }
  {
    Run run({config, "--log-format", "json"});
    REQUIRE(has(run.wait_for(kReady), kReady));
    CHECK(run.stop() == 0);
    std::istringstream lines(slurp(run.log));
    int parsed = 0;
    for (std::string line; std::getline(lines, line);) {
      CAPTURE(line);
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      REQUIRE(j.is_object());
      CHECK(j.contains("ts"));
      CHECK(j.contains("level"));
      CHECK(j.contains("message"));
      ++parsed;
    }
    CHECK(parsed >= 3);
  }
  std::string out;
  CHECK(sh("BALLAST_LOG_LEVEL=loud " + kExe + " run " + config, &out) == 2);
  CHECK(has(out, "BALLAST_LOG_LEVEL: 'loud': expected error, warn, info or debug"));
  CHECK(sh(kExe + " run " + config + " --log-level loud", &out) == 2);
  CHECK(has(out, "--log-level"));
}

TEST_CASE("ballast run --help names only files that exist") {
  std::string out;
  REQUIRE(sh(kExe + " run --help", &out) == 0);
  std::regex path("[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+\\.(lua|md)");
  int named = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), path); it != std::sregex_iterator(); ++it) {
    CAPTURE(it->str());
    CHECK(fs::exists(fs::path(kSrc) / it->str()));
    ++named;
  }
  CHECK(named >= 1);
  CHECK(has(out, "SIGUSR1"));
}
