// The `ballast` built-in commands on hostile input: JSON nested 100,000
// deep, invalid UTF-8 in what a policy returns, and config numbers that
// would wrap. Each ends in a clear error or correct output, never a crash.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

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
