// The command-line convention of every `ballast` command (plugins/common/
// command_line.hpp): --help on stdout with exit 0, a usage error with exit 2
// naming the unknown option or command and the closest valid one.
#include <doctest/doctest.h>

#include "command_line.hpp"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Captured {
  int rc;
  std::string out, err;
};

std::string slurp(std::FILE* f) {
  std::rewind(f);
  std::string text;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) text.append(buf.data(), n);
  return text;
}

// A small command: two options, a flag and a required one.
Captured parse(std::vector<std::string> args) {
  CLI::App app("a test command", "ballast test");
  std::string metrics;
  bool json = false;
  double score = 0;
  app.add_option("--metrics", metrics, "input")->required();
  app.add_flag("--json", json, "JSON");
  app.add_option("--min-score", score, "a score")->check(ballast::util::NumberIn(0, 10));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> out(std::tmpfile(), &std::fclose), err(std::tmpfile(), &std::fclose);
  const int rc = ballast::util::parse_command_line(app, std::move(args), out.get(), err.get());
  return {rc, slurp(out.get()), slurp(err.get())};
}

struct Run {
  int rc;
  std::string out;
};

Run run_ballast(const std::string& args, bool merge_stderr = true) {
  const std::string cmd = std::string(BALLAST_EXE) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128, out};
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("closest: a typo finds its word, an unrelated word finds none") {
  const std::vector<std::string> words{"--json", "--metrics", "--config", "report", "record"};
  CHECK(ballast::util::closest("--jsn", words) == "--json");
  CHECK(ballast::util::closest("--metrcs", words) == "--metrics");
  CHECK(ballast::util::closest("reprot", words) == "report");  // two letters swapped count one
  CHECK(ballast::util::closest("--verbose", words).empty());
  CHECK(ballast::util::closest("x", words).empty());
  CHECK(ballast::util::closest("", words).empty());
}

TEST_CASE("parse_command_line: goes on, answers --help, refuses with exit 2") {
  SUBCASE("valid arguments go on") {
    const Captured c = parse({"--metrics", "m.csv", "--json"});
    CHECK(c.rc == -1);
    CHECK(c.out.empty());
    CHECK(c.err.empty());
  }
  SUBCASE("--help prints the options to stdout, exit 0") {
    const Captured c = parse({"--help"});
    CHECK(c.rc == 0);
    CHECK(has(c.out, "--metrics"));
    CHECK(c.err.empty());
  }
  SUBCASE("an unknown option is named with the closest one, before the missing required option") {
    const Captured c = parse({"--jsn"});
    CHECK(c.rc == 2);
    CHECK(has(c.err, "ballast test: unknown option '--jsn' (did you mean '--json'?)"));
    CHECK(has(c.err, "ballast test --help"));
    CHECK(c.out.empty());
  }
  SUBCASE("an option given as --name=value is named without its value") {
    const Captured c = parse({"--metrics", "m", "--metrcs=x"});
    CHECK(c.rc == 2);
    CHECK(has(c.err, "unknown option '--metrcs' (did you mean '--metrics'?)"));
  }
  SUBCASE("a missing required option") {
    const Captured c = parse({"--json"});
    CHECK(c.rc == 2);
    CHECK(has(c.err, "--metrics is required"));
  }
  SUBCASE("a number that is not one, or NaN, is refused") {
    CHECK(parse({"--metrics", "m", "--min-score", "nan"}).rc == 2);
    CHECK(parse({"--metrics", "m", "--min-score", "11"}).rc == 2);
    CHECK(parse({"--metrics", "m", "--min-score", "3x"}).rc == 2);
    CHECK(parse({"--metrics", "m", "--min-score", "3"}).rc == -1);
  }
  SUBCASE("an unexpected positional argument") {
    const Captured c = parse({"--metrics", "m", "stray"});
    CHECK(c.rc == 2);
    CHECK(has(c.err, "unexpected argument 'stray'"));
  }
}

TEST_CASE("subcommands: an unknown verb is named with the closest one; a missing verb lists them") {
  CLI::App app("verbs", "ballast tool");
  app.require_subcommand(1);
  bool json = false;
  app.add_subcommand("report", "r")->add_flag("--json", json, "JSON");
  app.add_subcommand("record", "r");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> out(std::tmpfile(), &std::fclose), err(std::tmpfile(), &std::fclose);
  CHECK(ballast::util::parse_command_line(app, {"reprot"}, out.get(), err.get()) == 2);
  CHECK(has(slurp(err.get()), "ballast tool: unknown command 'reprot' (did you mean 'report'?)"));
  CLI::App again("verbs", "ballast tool");
  again.require_subcommand(1);
  again.add_subcommand("report", "r")->add_flag("--json", json, "JSON");
  again.add_subcommand("record", "r");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> err2(std::tmpfile(), &std::fclose);
  CHECK(ballast::util::parse_command_line(again, {}, out.get(), err2.get()) == 2);
  CHECK(has(slurp(err2.get()), "a command is required: one of report, record"));
  CLI::App third("verbs", "ballast tool");
  third.add_subcommand("report", "r")->add_flag("--json", json, "JSON");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> err3(std::tmpfile(), &std::fclose);
  CHECK(ballast::util::parse_command_line(third, {"report", "--jsno"}, out.get(), err3.get()) == 2);
  CHECK(has(slurp(err3.get()), "ballast tool report: unknown option '--jsno' (did you mean '--json'?)"));
}

// Every command of the real executable, built-in and from plugins.
TEST_CASE("ballast: every command answers a usage error with exit 2 and names the option") {
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"detect --metrics m.csv --jsn", "ballast detect: unknown option '--jsn' (did you mean '--json'?)"},
      {"suspects --events - --min-scor 1",
       "ballast suspects: unknown option '--min-scor' (did you mean '--min-score'?)"},
      {"whatif --trac t.csv", "ballast whatif: unknown option '--trac' (did you mean '--trace'?)"},
      {"launch -n 2 --stal 3 -- true", "ballast launch: unknown option '--stal' (did you mean '--stall'?)"},
      {"launch -n 2", "ballast launch: missing the command after --"},
      {"launch -n 0 -- true", "ballast launch: --nproc: Value 0 not in range"},
      {"analyze d --chrom x", "ballast analyze: unknown option '--chrom' (did you mean '--chrome'?)"},
      {"analyze", "ballast analyze: DIR is required"},
      {"plan --topolgy t.conf", "ballast plan: unknown option '--topolgy' (did you mean '--topology'?)"},
      {"plan", "ballast plan: --topology and --job are required"},
      {"startup reprot f", "ballast startup: unknown command 'reprot' (did you mean 'report'?)"},
      {"startup", "ballast startup: a command is required"},
      {"startup load f --strips 2", "ballast startup load: unknown option '--strips' (did you mean '--stripes'?)"},
      {"startup time s", "ballast startup time: missing the command after --"},
      {"journal cat", "ballast journal cat: FILE is required"},
      {"journal cat f --jsno", "ballast journal cat: unknown option '--jsno' (did you mean '--json'?)"},
      {"plugins --jsn", "ballast plugins: unknown option '--jsn' (did you mean '--json'?)"},
      {"policy chek x", "ballast policy: unknown command 'chek' (did you mean 'check'?)"},
      {"detetc --metrics m.csv", "ballast: unknown command 'detetc' (did you mean 'detect'?)"},
      {"--verison", "ballast: unknown option '--verison' (did you mean '--version'?)"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.args);
    const Run r = run_ballast(c.args);
    CAPTURE(r.out);
    CHECK(r.rc == 2);
    CHECK(has(r.out, c.expect));
  }
}

TEST_CASE("ballast: --help of every command prints its usage on stdout, exit 0") {
  for (const std::string cmd : {"", "detect", "suspects", "whatif", "launch", "analyze", "plan", "startup",
                                "startup load", "journal cat", "plugins", "policy check"}) {
    CAPTURE(cmd);
    const Run r = run_ballast(cmd + " --help", false);
    CHECK(r.rc == 0);
    CHECK(has(r.out, "Usage:"));
  }
}

TEST_CASE("ballast --version prints the version, exit 0") {
  const Run r = run_ballast("--version", false);
  CHECK(r.rc == 0);
  CHECK(r.out == "ballast " BALLAST_TEST_VERSION "\n");
}
