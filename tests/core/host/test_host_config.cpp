// A config that has a typo or a plugin that cannot run fails at once, naming
// the key, the field and (through `ballast run`) the file: unknown keys at the
// top level, in the host's tables, in a plugin entry and in a plugin's config
// (the keys a plugin asks for in create); a plugin that fails to load, create
// or start, unless it is optional; `plugins = {}` is an empty list.
#include "config_file.hpp"
#include "error.hpp"
#include "host_config.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using namespace ballast;

namespace {

const std::string kHello = std::string(BALLAST_PLUGIN_DIR) + "/ballast-hello.so";
const std::string kStartFails = std::string(HOST_PLUGIN_DIR) + "/start_fails.so";

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// host_from_config of a Lua chunk; the status, with last_error() kept.
int build(const std::string& lua, std::unique_ptr<Host>* host) {
  nlohmann::json config;
  REQUIRE(eval_lua_table(lua, true, &config) == BALLAST_OK);
  return host_from_config(config, fs::temp_directory_path().string(), host);
}

}  // namespace

TEST_CASE("an unknown top-level key is an error naming it and the closest key") {
  std::unique_ptr<Host> host;
  CHECK(build("return { polcy = 'default.lua' }", &host) == BALLAST_EINVAL);
  CHECK(has(last_error(), "unknown key 'polcy'"));
  CHECK(has(last_error(), "did you mean 'policy'"));
  CHECK(build("return { plugin = { 'hello' } }", &host) == BALLAST_EINVAL);
  CHECK(has(last_error(), "unknown key 'plugin'"));
  CHECK(has(last_error(), "did you mean 'plugins'"));
  CHECK(host == nullptr);
}

TEST_CASE("unknown keys in the host's tables and in a plugin entry are errors naming them") {
  std::unique_ptr<Host> host;
  CHECK(build("return { bus = { queue_capacty = 8 } }", &host) == BALLAST_EINVAL);
  CHECK(has(last_error(), "'bus.queue_capacty'"));
  CHECK(has(last_error(), "'bus.queue_capacity'"));
  CHECK(build("return { policy = { script = 'x.lua', deadline = 5 } }", &host) == BALLAST_EINVAL);
  CHECK(has(last_error(), "'policy.deadline'"));
  CHECK(build("return { metrics = { listn = ':0' } }", &host) == BALLAST_EINVAL);
  CHECK(has(last_error(), "'metrics.listn'"));
  CHECK(build("return { plugins = { { path = '" + kHello + "', confg = { greeting = 'hi' } } } }", &host) ==
        BALLAST_EINVAL);
  CHECK(has(last_error(), "'plugins[1].confg'"));
  CHECK(has(last_error(), "did you mean 'plugins[1].config'"));
}

TEST_CASE("a plugin config key the plugin never asks for is refused, naming the key and the keys it takes") {
  std::unique_ptr<Host> host;
  CHECK(build("return { plugins = { { path = '" + kHello + "', config = { greting = 'hi' } } } }", &host) ==
        BALLAST_EINVAL);
  const std::string message = last_error();
  CHECK(has(message, "plugins[1]"));
  CHECK(has(message, "unknown config key 'greting'"));
  CHECK(has(message, "did you mean 'greeting'"));
  CHECK(has(message, "the keys it takes: greeting, period_ms"));

  // Through the host directly (an embedder's load_plugin) too; a nested key
  // under a key the plugin reads whole is its own business.
  Host direct;
  CHECK(direct.load_plugin(kHello, {{"greeting", "hi"}, {"colour", "red"}}) == BALLAST_EINVAL);
  CHECK(has(last_error(), "'colour'"));
  CHECK(direct.plugin_count() == 0);
  CHECK(direct.load_plugin(kHello, {{"greeting", "hi"}, {"period_ms", 10}}) == BALLAST_OK);
}

TEST_CASE("a plugin that fails to load stops the config, unless it is optional") {
  std::unique_ptr<Host> host;
  CHECK(build("return { plugins = { 'no-such-plugin' } }", &host) != BALLAST_OK);
  CHECK(has(last_error(), "plugins[1]"));
  CHECK(has(last_error(), "no-such-plugin"));
  CHECK(build("return { plugins = { { path = '" + kHello + "', config = { period_ms = 'soon' } } } }", &host) !=
        BALLAST_OK);
  CHECK(has(last_error(), "period_ms"));

  REQUIRE(build("return { plugins = { { path = 'no-such-plugin', optional = true }, '" + kHello + "' } }", &host) ==
          BALLAST_OK);
  CHECK(host->plugin_count() == 1);
  CHECK(build("return { plugins = { { path = '" + kHello + "', optional = 'yes' } } }", &host) == BALLAST_EINVAL);
  CHECK(has(last_error(), "plugins[1].optional"));
}

TEST_CASE("a plugin that fails to start fails start(), unless it is optional") {
  {
    std::unique_ptr<Host> host;
    REQUIRE(build("return { plugins = { '" + kHello + "', '" + kStartFails + "' } }", &host) == BALLAST_OK);
    CHECK(host->start() == BALLAST_EPLUGIN);
    CHECK(has(last_error(), "startfails failed to start"));
  }
  {
    std::unique_ptr<Host> host;
    REQUIRE(build("return { plugins = { '" + kHello + "', { path = '" + kStartFails + "', optional = true } } }",
                  &host) == BALLAST_OK);
    CHECK(host->start() == BALLAST_OK);
    host->stop();
  }
}

TEST_CASE("plugins = {} is an empty list") {
  std::unique_ptr<Host> host;
  REQUIRE(build("return { plugins = {} }", &host) == BALLAST_OK);
  CHECK(host->plugin_count() == 0);
}

TEST_CASE("log_level and log_format are checked") {
  std::unique_ptr<Host> host;
  CHECK(build("return { log_level = 'loud' }", &host) == BALLAST_EINVAL);
  CHECK(has(last_error(), "log_level"));
  CHECK(build("return { log_format = 'xml' }", &host) == BALLAST_EINVAL);
  CHECK(has(last_error(), "log_format"));
  CHECK(build("return { log_level = 'debug', log_format = 'json' }", &host) == BALLAST_OK);
}
