#include "config_file.hpp"

#include "error.hpp"
#include "lua_json.hpp"
#include "lua_sandbox.hpp"

#include <ballast/status.h>

#include <charconv>
#include <string_view>

namespace ballast {

int eval_lua_table(const std::string& path_or_chunk, bool from_string, nlohmann::json* out) {
  return eval_lua_table(path_or_chunk, from_string, out, ConfigLimits{});
}

int eval_lua_table(const std::string& path_or_chunk, bool from_string, nlohmann::json* out,
                   const ConfigLimits& limits) {
  std::string source;
  std::string display = from_string ? "(config string)" : path_or_chunk;
  if (from_string) {
    source = path_or_chunk;
  } else if (int rc = read_script_file(path_or_chunk, "config", &source); rc != BALLAST_OK) {
    return rc;
  }
  std::unique_ptr<LuaSandbox> sandbox;
  if (int rc = LuaSandbox::create({limits.deadline_ms, limits.memory_limit_bytes}, &sandbox); rc != BALLAST_OK) {
    return fail(rc, "config " + display + ": " + last_error());
  }
  std::string error;
  LuaFailure f = sandbox->load(source, from_string ? "=" + display : "@" + path_or_chunk, &error);
  if (f == LuaFailure::none) f = sandbox->call(0, 1, &error);
  if (f != LuaFailure::none) {
    // The first line has the file and the line; a traceback of a
    // configuration file is noise.
    return fail(lua_failure_status(f), "config: " + error.substr(0, error.find("\nstack traceback:")));
  }
  lua_State* L = sandbox->state();
  if (!lua_istable(L, -1)) {
    return fail(BALLAST_EINVAL,
                "config " + display + ": the file must return a table; it returns " +
                    (lua_isnil(L, -1) ? std::string("nothing") : std::string("a ") + luaL_typename(L, -1)));
  }
  nlohmann::json result;
  if (!lua_to_json(L, -1, "", JsonLimits{}, &result, &error)) {
    return fail(BALLAST_EINVAL, "config " + display + ": " + error);
  }
  *out = std::move(result);
  return BALLAST_OK;
}

const nlohmann::json* config_lookup(const nlohmann::json& config, const std::string& key) {
  const nlohmann::json* cur = &config;
  std::string_view rest(key);
  while (!rest.empty()) {
    size_t dot = rest.find('.');
    std::string_view part = rest.substr(0, dot);
    rest = dot == std::string_view::npos ? std::string_view() : rest.substr(dot + 1);
    if (cur->is_object()) {
      auto it = cur->find(std::string(part));
      if (it == cur->end()) return nullptr;
      cur = &*it;
    } else if (cur->is_array()) {
      size_t index = 0;  // 1-based, as in the Lua table
      auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
      if (ec != std::errc() || end != part.data() + part.size() || index < 1 || index > cur->size()) {
        return nullptr;
      }
      cur = &(*cur)[index - 1];
    } else {
      return nullptr;
    }
  }
  return cur;
}

std::string config_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ballast
