// Configuration files are Lua tables evaluated in the sandbox and converted
// to JSON; errors name the file, the line or the key.
#include "config_file.hpp"
#include "error.hpp"

#include <ballast/status.h>

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

using nlohmann::json;

namespace {

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ballast-config-XXXXXX").string();
    char* dir = mkdtemp(tmpl.data());
    REQUIRE(dir != nullptr);
    dir_ = dir;
    path_ = (dir_ / "ballast.lua").string();
    std::ofstream(path_) << text;
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::filesystem::path dir_;
  std::string path_;
};

int eval_file(const std::string& text, json* out, const ballast::ConfigLimits& limits = {}) {
  TempFile f(text);
  return ballast::eval_lua_table(f.path(), false, out, limits);
}

std::string error() { return ballast::last_error(); }

}  // namespace

TEST_CASE("a configuration file becomes JSON") {
  json config;
  REQUIRE(eval_file(R"(
    local gpus = 8                         -- locals and expressions are fine
    return {
      node = "gpu" .. string.format("%03d", 1),
      role = "agent",
      plugins = {
        { path = "ballast-hello.so", config = { greeting = "hi", period = 0.5 } },
        "ballast-collect",
      },
      policy = { script = "default.lua", deadline_ms = 100, memory_mb = 64 },
      bus = { dispatcher_threads = gpus // 4, lossy = false },
      empty = {},
    })",
                    &config) == BALLAST_OK);
  CHECK(config ==
        json{{"node", "gpu001"},
             {"role", "agent"},
             {"plugins",
              {{{"path", "ballast-hello.so"}, {"config", {{"greeting", "hi"}, {"period", 0.5}}}}, "ballast-collect"}},
             {"policy", {{"script", "default.lua"}, {"deadline_ms", 100}, {"memory_mb", 64}}},
             {"bus", {{"dispatcher_threads", 2}, {"lossy", false}}},
             {"empty", json::object()}});
}

TEST_CASE("a chunk is evaluated the same way") {
  json config;
  REQUIRE(ballast::eval_lua_table("return { a = { 1, 2, 3 } }", true, &config) == BALLAST_OK);
  CHECK(config == json{{"a", {1, 2, 3}}});
  CHECK(ballast::eval_lua_table("return {", true, &config) == BALLAST_EFORMAT);
  CHECK(error().find("(config string):1:") != std::string::npos);
}

TEST_CASE("syntax and runtime errors name the file and the line") {
  json config;
  CHECK(eval_file("return {\n  a = 1,\n  b = = 2,\n}", &config) == BALLAST_EFORMAT);
  CHECK(error().find("ballast.lua:3:") != std::string::npos);
  CHECK(eval_file("local x = nil\nreturn { a = x.field }", &config) == BALLAST_EINVAL);
  CHECK(error().find("ballast.lua:2:") != std::string::npos);
  CHECK(error().find("stack traceback") == std::string::npos);
  CHECK(eval_file("return 42", &config) == BALLAST_EINVAL);
  CHECK(error().find("must return a table; it returns a number") != std::string::npos);
  CHECK(eval_file("x = 1", &config) == BALLAST_EINVAL);
  CHECK(error().find("must return a table; it returns nothing") != std::string::npos);
  CHECK(ballast::eval_lua_table("/nonexistent/ballast.lua", false, &config) == BALLAST_ENOTFOUND);
  CHECK(error().find("/nonexistent/ballast.lua") != std::string::npos);
}

TEST_CASE("values that are not data are errors naming the key path") {
  struct Case {
    const char* chunk;
    const char* expected;
  } cases[] = {
      {"return { plugins = { 'a', { config = { cb = function() end } } } }", "'plugins[2].config.cb': a function"},
      {"local t = {} t.self = t return { t = t }", "'t.self': a cycle"},
      {"return { mixed = { 1, 2, x = 3 } }", "'mixed': a table mixes list elements and string keys"},
      {"return { holes = { [1] = 1, [3] = 3 } }", "'holes': a list with holes"},
      {"return { [true] = 1 }", "key of type boolean"},
      {"return { n = 0/0 }", "'n': not a finite number"},
      {"return { c = coroutine.create(function() end) }", "'c': a thread"},
  };
  for (const Case& c : cases) {
    json config;
    INFO(std::string(c.chunk));
    CHECK(ballast::eval_lua_table(c.chunk, true, &config) == BALLAST_EINVAL);
    INFO(error());
    CHECK(error().find(c.expected) != std::string::npos);
  }
}

TEST_CASE("configuration files run in the sandbox, with a deadline and a memory cap") {
  json config;
  ballast::ConfigLimits tight{50, 4u << 20};
  CHECK(eval_file("while true do end", &config, tight) == BALLAST_ETIMEDOUT);
  CHECK(error().find("deadline of 50 ms exceeded") != std::string::npos);
  CHECK(eval_file("local s = string.rep('x', 1e8) return {}", &config, tight) == BALLAST_ENOMEM);
  CHECK(eval_file("return { f = io.open('/etc/passwd') }", &config) == BALLAST_EINVAL);
  CHECK(error().find("global 'io'") != std::string::npos);
  CHECK(eval_file("return { h = os.getenv('HOME') }", &config) == BALLAST_EINVAL);
}

TEST_CASE("config_lookup follows dotted keys and 1-based list indices") {
  json config = {{"window", {{"seconds", 30}}}, {"plugins", {"a", {{"path", "b.so"}}}}};
  REQUIRE(ballast::config_lookup(config, "window.seconds") != nullptr);
  CHECK(*ballast::config_lookup(config, "window.seconds") == 30);
  CHECK(*ballast::config_lookup(config, "plugins.1") == "a");
  CHECK(*ballast::config_lookup(config, "plugins.2.path") == "b.so");
  CHECK(ballast::config_lookup(config, "plugins.0") == nullptr);
  CHECK(ballast::config_lookup(config, "plugins.3") == nullptr);
  CHECK(ballast::config_lookup(config, "plugins.x") == nullptr);
  CHECK(ballast::config_lookup(config, "window.minutes") == nullptr);
  CHECK(ballast::config_lookup(config, "window.seconds.more") == nullptr);
  CHECK(ballast::config_lookup(config, "") == &config);
}

TEST_CASE("config_text gives plugins strings, numbers, booleans and JSON") {
  CHECK(ballast::config_text(json("hi")) == "hi");
  CHECK(ballast::config_text(json(42)) == "42");
  CHECK(ballast::config_text(json(0.1)) == "0.1");
  CHECK(ballast::config_text(json(-2.5e-7)) == "-2.5e-07");
  CHECK(ballast::config_text(json(true)) == "true");
  CHECK(ballast::config_text(json(false)) == "false");
  CHECK(ballast::config_text(json{1, 2}) == "[1,2]");
  CHECK(ballast::config_text(json{{"a", "b"}}) == R"({"a":"b"})");
  CHECK(ballast::config_text(json()) == "null");
}

TEST_CASE("a config whose string patterns backtrack stops at the 1 s deadline, naming the file") {
  json config;
  // 2^40 tries in Lua's own matcher; the sandbox's stops at the deadline.
  const char* text =
      "local s = string.rep('a', 40)\n"
      "local p = string.rep('a?', 40) .. s\n"
      "return { x = s:find(p) }\n";
  CHECK(eval_file(text, &config) == BALLAST_ETIMEDOUT);
  INFO(error());
  CHECK(error().find("ballast.lua:3:") != std::string::npos);
  CHECK(error().find("string.find: deadline of 1000 ms exceeded") != std::string::npos);
  // One 1 MB string 400,000 times: stock Lua's sort would compare 1.2 TB in C,
  // over 10 s even where the string stays in cache (20,000 finished within the
  // second on a fast machine).
  const char* sort =
      "local s = string.rep('a', 1e6) local t = {} for i = 1, 4e5 do t[i] = s end table.sort(t) return {}";
  CHECK(eval_file(sort, &config) == BALLAST_ETIMEDOUT);
  CHECK(error().find("table.sort: deadline of 1000 ms exceeded") != std::string::npos);
}
