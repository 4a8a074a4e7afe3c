#include "lua_config.hpp"

#include "utf8.hpp"

#include <lua.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>

namespace ballast::util {

namespace {

constexpr size_t kMemoryCap = 32u << 20;
constexpr size_t kMaxFileBytes = 4u << 20;
constexpr std::chrono::milliseconds kDeadline{1000};
constexpr int kMaxDepth = 64;
constexpr size_t kMaxValues = 1000000;

struct Budget {
  size_t used = 0;
  std::chrono::steady_clock::time_point deadline;
};

void* capped_alloc(void* ud, void* ptr, size_t old_size, size_t new_size) {
  auto* b = static_cast<Budget*>(ud);
  if (ptr == nullptr) old_size = 0;  // then old_size is the type of the object
  if (new_size == 0) {
    std::free(ptr);
    b->used -= old_size;
    return nullptr;
  }
  if (new_size > old_size && b->used + (new_size - old_size) > kMemoryCap) return nullptr;
  void* p = std::realloc(ptr, new_size);
  if (p != nullptr) b->used = b->used - old_size + new_size;
  return p;
}

// Every 1000 instructions: past the deadline, an error (a loop in the file).
void deadline_hook(lua_State* L, lua_Debug*) {
  void* ud = nullptr;
  lua_getallocf(L, &ud);
  if (std::chrono::steady_clock::now() > static_cast<Budget*>(ud)->deadline)
    luaL_error(L, "the configuration ran longer than %d ms", int(kDeadline.count()));
}

// _ENV of the chunk: the base functions that cannot reach the system, and
// the string, math, table and utf8 libraries.
void push_environment(lua_State* L) {
  luaL_requiref(L, "_G", luaopen_base, 1);
  luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
  luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
  luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
  luaL_requiref(L, LUA_UTF8LIBNAME, luaopen_utf8, 1);
  lua_pop(L, 5);
  lua_newtable(L);
  for (const char* name : {"assert", "error", "ipairs", "next", "pairs", "pcall", "rawequal", "rawget", "rawlen",
                           "select", "tonumber", "tostring", "type", "_VERSION", "string", "math", "table", "utf8"}) {
    lua_getglobal(L, name);
    lua_setfield(L, -2, name);
  }
}

class ToJson {
 public:
  explicit ToJson(lua_State* L) : L_(L) {}

  // The value at the top of the stack; false with *error naming the path.
  bool value(const std::string& path, int depth, nlohmann::json* out, std::string* error) {
    if (++values_ > kMaxValues) return fail(path, "more than a million values", error);
    switch (lua_type(L_, -1)) {
      case LUA_TBOOLEAN:
        *out = bool(lua_toboolean(L_, -1));
        return true;
      case LUA_TSTRING: {
        size_t n = 0;
        const char* s = lua_tolstring(L_, -1, &n);
        *out = std::string(s, n);
        if (!valid_utf8(out->get_ref<const std::string&>())) return fail(path, "not valid UTF-8", error);
        return true;
      }
      case LUA_TNUMBER:
        if (lua_isinteger(L_, -1)) {
          *out = int64_t(lua_tointeger(L_, -1));
          return true;
        }
        if (!std::isfinite(lua_tonumber(L_, -1))) return fail(path, "not a finite number", error);
        *out = double(lua_tonumber(L_, -1));
        return true;
      case LUA_TTABLE:
        return table(path, depth, out, error);
      default:
        return fail(path, std::string("a ") + luaL_typename(L_, -1) + " is not a configuration value", error);
    }
  }

 private:
  static bool fail(const std::string& path, const std::string& what, std::string* error) {
    *error = (path.empty() ? "the table" : path) + ": " + what;
    return false;
  }

  bool table(const std::string& path, int depth, nlohmann::json* out, std::string* error) {
    if (depth >= kMaxDepth) return fail(path, "nested deeper than 64 tables", error);
    const void* id = lua_topointer(L_, -1);
    if (!open_.insert(id).second) return fail(path, "a table that contains itself", error);
    if (!lua_checkstack(L_, 4)) return fail(path, "out of Lua stack", error);
    // Keys first: a sequence 1..n is an array, string keys an object.
    size_t integer_keys = 0, string_keys = 0;
    lua_Integer max_key = 0;
    lua_pushnil(L_);
    while (lua_next(L_, -2) != 0) {
      lua_pop(L_, 1);
      if (lua_type(L_, -1) == LUA_TSTRING) {
        ++string_keys;
      } else if (lua_isinteger(L_, -1) && lua_tointeger(L_, -1) >= 1) {
        ++integer_keys;
        max_key = std::max(max_key, lua_tointeger(L_, -1));
      } else {
        lua_pop(L_, 1);
        return fail(path, "a key that is neither a string nor a positive integer", error);
      }
    }
    if (integer_keys > 0 && (string_keys > 0 || size_t(max_key) != integer_keys))
      return fail(path, "mixed or sparse keys: neither a list nor a table of names", error);
    if (integer_keys > 0) {
      *out = nlohmann::json::array();
      for (lua_Integer i = 1; i <= max_key; ++i) {
        lua_rawgeti(L_, -1, i);
        nlohmann::json v;
        const bool ok = value(path + "[" + std::to_string(i) + "]", depth + 1, &v, error);
        lua_pop(L_, 1);
        if (!ok) return false;
        out->push_back(std::move(v));
      }
    } else {
      *out = nlohmann::json::object();
      lua_pushnil(L_);
      while (lua_next(L_, -2) != 0) {
        size_t n = 0;
        const char* k = lua_tolstring(L_, -2, &n);  // a string key: no conversion in place
        const std::string key(k, n);
        if (!valid_utf8(key)) {
          lua_pop(L_, 2);
          return fail(path, "a key that is not valid UTF-8", error);
        }
        nlohmann::json v;
        const bool ok = value(path.empty() ? key : path + "." + key, depth + 1, &v, error);
        lua_pop(L_, 1);
        if (!ok) {
          lua_pop(L_, 1);
          return false;
        }
        (*out)[key] = std::move(v);
      }
    }
    open_.erase(id);
    return true;
  }

  lua_State* L_;
  std::set<const void*> open_;  // the tables on the current path
  size_t values_ = 0;
};

}  // namespace

bool eval_lua_config(const std::string& path, nlohmann::json* out, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ": cannot open";
    return false;
  }
  std::string source;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    source.append(buf, size_t(in.gcount()));
    if (source.size() > kMaxFileBytes) {
      *error = path + ": larger than 4 MiB: not a configuration file";
      return false;
    }
  }
  Budget budget;
  budget.deadline = std::chrono::steady_clock::now() + kDeadline;
  std::unique_ptr<lua_State, void (*)(lua_State*)> state(lua_newstate(capped_alloc, &budget), lua_close);
  lua_State* L = state.get();
  if (L == nullptr) {
    *error = path + ": cannot create a Lua state";
    return false;
  }
  lua_sethook(L, deadline_hook, LUA_MASKCOUNT, 1000);
  // Everything that may raise a Lua error runs protected.
  lua_pushcfunction(L, [](lua_State* L) -> int {
    push_environment(L);
    return 1;
  });
  if (lua_pcall(L, 0, 1, 0) != LUA_OK) {
    *error = path + ": " + (lua_tostring(L, -1) ? lua_tostring(L, -1) : "cannot set up Lua");
    return false;
  }
  // Lua names the file and line in its syntax errors but not in all (the
  // parser's "C stack overflow" on deep nesting): the file is named anyway.
  const auto lua_error = [&](const char* fallback) {
    std::string what = lua_tostring(L, -1) ? lua_tostring(L, -1) : fallback;
    if (what == "C stack overflow") what = "nested too deeply (Lua's C stack overflow)";
    return what.rfind(path + ":", 0) == 0 ? what : path + ": " + what;
  };
  if (luaL_loadbufferx(L, source.data(), source.size(), ("@" + path).c_str(), "t") != LUA_OK) {
    *error = lua_error("cannot load");
    return false;
  }
  lua_pushvalue(L, -2);
  lua_setupvalue(L, -2, 1);  // _ENV
  if (lua_pcall(L, 0, 1, 0) != LUA_OK) {
    *error = lua_error("error (not a string)");
    return false;
  }
  if (!lua_istable(L, -1)) {
    *error = path + ": the file must return a table; it returns " +
             (lua_isnil(L, -1) ? std::string("nothing") : std::string("a ") + luaL_typename(L, -1));
    return false;
  }
  lua_sethook(L, nullptr, 0, 0);
  std::string what;
  if (!ToJson(L).value("", 0, out, &what)) {
    *error = path + ": " + what;
    return false;
  }
  return true;
}

std::string config_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ballast::util
