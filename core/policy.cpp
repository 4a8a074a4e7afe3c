#include "policy.hpp"

#include "error.hpp"
#include "lua_event.hpp"
#include "lua_json.hpp"
#include "lua_sandbox.hpp"
#include "topic.hpp"

#include <ballast/plugin.h>
#include <ballast/status.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <string_view>

namespace ballast {

namespace {

constexpr size_t kMaxHandlers = 1024;
constexpr size_t kMaxActionsPerCall = 256;
constexpr size_t kMaxPendingLogs = 64;
constexpr size_t kMaxReason = 200;
// What one handler call may hand out in all (its ballast.publish payloads
// and the actions it returns), also never more than the room left under the
// state's memory cap: a few MiB of Lua values can reference one string many
// times, and the conversion runs in C++ where neither the deadline nor the
// cap would stop it.
constexpr size_t kMaxOutputBytes = 4u << 20;
constexpr size_t kMaxOutputValues = 100000;

bool is_action(std::string_view name) {
  static const std::string_view kNames[] = {kRecoveryActions[0], kRecoveryActions[1], kRecoveryActions[2],
                                            kRecoveryActions[3], kRecoveryActions[4], kRecoveryActions[5],
                                            kRecoveryActions[6]};
  static_assert(std::size(kRecoveryActions) == std::size(kNames));
  for (std::string_view a : kNames) {
    if (name == a) return true;
  }
  return false;
}

std::string action_names() {
  std::string names;
  for (const char* a : kRecoveryActions) names += (names.empty() ? "" : ", ") + std::string(a);
  return names;
}

std::string first_line(const std::string& s, size_t max) {
  std::string line = s.substr(0, s.find('\n'));
  if (line.size() > max) line = line.substr(0, max) + "...";
  return line;
}

int log_level(const char* name) {
  static const char* const kLevels[] = {"error", "warn", "info", "debug"};
  static_assert(BALLAST_LOG_ERROR == 0 && BALLAST_LOG_DEBUG == 3);
  for (int i = 0; i < 4; ++i) {
    if (std::strcmp(name, kLevels[i]) == 0) return i;
  }
  return -1;
}

// Count `bytes` of output text against the call's budget (limits.shared).
bool count_output(const JsonLimits& limits, size_t bytes, std::string* why) {
  if (limits.shared == nullptr) return true;
  limits.shared->bytes += bytes;
  if (limits.shared->bytes <= limits.max_bytes) return true;
  *why = "more than " + std::to_string(limits.max_bytes) + " bytes of strings in the outputs of one call";
  return false;
}

// The action table at idx into *a (a fresh PolicyAction): raw reads only,
// nothing allocated in Lua, so it never raises. On failure *why says what is
// wrong. Its strings count against `limits` (the call's outputs).
bool read_action(lua_State* L, int idx, PolicyAction* a, std::string* why, const JsonLimits& limits = {}) {
  idx = lua_absindex(L, idx);
  if (lua_type(L, idx) != LUA_TTABLE) {
    *why = std::string("an action must be a table, not a ") + luaL_typename(L, idx);
    return false;
  }
  if (!lua_checkstack(L, 4)) {
    *why = "Lua stack overflow";
    return false;
  }
  bool has_action = false;
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    if (lua_type(L, -2) != LUA_TSTRING) {
      *why = "an action table has only the fields action, subject, reason and args";
      return false;
    }
    size_t kl = 0, vl = 0;
    const char* k = lua_tolstring(L, -2, &kl);
    std::string_view key(k, kl);
    int vt = lua_type(L, -1);
    const char* v = vt == LUA_TSTRING ? lua_tolstring(L, -1, &vl) : nullptr;
    if (v != nullptr && !count_output(limits, vl, why)) return false;
    if (key == "action") {
      if (v == nullptr) {
        *why = std::string("field 'action' must be a string, not a ") + luaL_typename(L, -1);
        return false;
      }
      if (!is_action(std::string_view(v, vl))) {
        *why = "unknown action '" + std::string(v, vl) + "' (expected one of " + action_names() + ")";
        return false;
      }
      a->action.assign(v, vl);
      has_action = true;
    } else if (key == "subject") {
      if (v != nullptr) {
        a->subject.assign(v, vl);
      } else if (vt == LUA_TNUMBER && lua_isinteger(L, -1)) {
        a->subject = std::to_string(lua_tointeger(L, -1));
      } else {
        *why = std::string("field 'subject' must be a string, not a ") + luaL_typename(L, -1);
        return false;
      }
    } else if (key == "reason") {
      if (v == nullptr) {
        *why = std::string("field 'reason' must be a string, not a ") + luaL_typename(L, -1);
        return false;
      }
      a->reason.assign(v, vl);
    } else if (key == "args") {
      nlohmann::json args;
      if (vt != LUA_TTABLE || !lua_to_json(L, -1, "args", limits, &args, why)) {
        if (vt != LUA_TTABLE) *why = std::string("field 'args' must be a table, not a ") + luaL_typename(L, -1);
        return false;
      }
      if (!args.is_object()) {
        *why = "field 'args' must be a table with string keys";
        return false;
      }
      a->args_json = args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    } else {
      *why = "unknown field '" + std::string(key) + "' (expected action, subject, reason, args)";
      return false;
    }
    lua_pop(L, 1);
  }
  if (!has_action) {
    *why = "an action table needs a field 'action' (one of " + action_names() + ")";
    return false;
  }
  if (a->args_json.empty()) a->args_json = "{}";
  return true;
}

// A handler's return value at idx: nil or false (no action), an action
// table, or a list of them. Raw reads only.
bool read_result(lua_State* L, int idx, std::string_view topic, std::vector<PolicyAction>* out, std::string* why,
                 const JsonLimits& limits) {
  idx = lua_absindex(L, idx);
  int t = lua_type(L, idx);
  if (t == LUA_TNIL || (t == LUA_TBOOLEAN && !lua_toboolean(L, idx))) return true;
  if (t != LUA_TTABLE) {
    *why = std::string("a handler returns nil, an action table or a list of them, not a ") + lua_typename(L, t);
    return false;
  }
  lua_pushnil(L);
  if (lua_next(L, idx) == 0) return true;  // {}: no action
  // An action has string keys only: a list has a numeric key and t[1].
  bool list = lua_type(L, -2) == LUA_TNUMBER;
  lua_pop(L, 2);
  if (list) {
    list = lua_rawgeti(L, idx, 1) != LUA_TNIL;
    lua_pop(L, 1);
  }
  if (!list) {
    out->emplace_back();
    if (!read_action(L, idx, &out->back(), why, limits)) return false;
    out->back().cause_topic = topic;
    return true;
  }
  size_t n = lua_rawlen(L, idx);
  if (n > kMaxActionsPerCall) {
    *why = "more than " + std::to_string(kMaxActionsPerCall) + " actions in one call";
    return false;
  }
  size_t keys = 0;
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    ++keys;
    lua_pop(L, 1);
  }
  if (keys != n) {
    *why = "a list of actions must be a sequence of action tables";
    return false;
  }
  for (size_t i = 1; i <= n; ++i) {
    lua_rawgeti(L, idx, lua_Integer(i));
    out->emplace_back();
    bool ok = read_action(L, -1, &out->back(), why, limits);
    lua_settop(L, idx);
    if (!ok) {
      *why = "action [" + std::to_string(i) + "]: " + *why;
      return false;
    }
    out->back().cause_topic = topic;
  }
  return true;
}

// Everything a policy's Lua functions reach (through a light userdata
// upvalue); Policy::Impl is this.
struct PolicyRuntime {
  struct Handler {
    std::string pattern;
    TopicMatcher matcher;  // points into pattern
    int ref;               // the function in the registry
    std::string where;     // file:line of its definition
  };

  std::string path;
  std::string name;
  PolicyOptions options;
  std::unique_ptr<LuaSandbox> sandbox;
  std::vector<Handler> handlers;
  bool loading = false;                                   // the script's top level is running
  PolicySink* sink = nullptr;                             // set while handle() runs
  std::vector<std::pair<int, std::string>> pending_logs;  // logged at load time
  // Message of a failure in a Lua C function, raised after the C++ work is
  // done (a member: the longjmp never skips its destructor).
  std::string raise_message;
  // Reused per event.
  EventConversion conv;
  std::vector<size_t> matched;
  std::vector<PolicyAction> actions;
  // The outputs of the handler call in progress (kMaxOutputBytes).
  JsonUsage output_used;
  JsonLimits output_limits;
  // Set by Policy::stop() from any thread.
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> skipped{0};

  // A fresh output budget for the next handler call.
  void reset_outputs() {
    output_used = {};
    output_limits.shared = &output_used;
    output_limits.max_values = kMaxOutputValues;
    output_limits.max_bytes = kMaxOutputBytes;
  }
  // Before a conversion: the bytes converted so far plus the room left under
  // the memory cap now, at most kMaxOutputBytes.
  const JsonLimits& outputs_now() {
    uint64_t cap = options.memory_limit_bytes, used = sandbox->memory_in_use();
    uint64_t room = output_used.bytes + (cap > used ? cap - used : 0);
    output_limits.max_bytes = size_t(std::min<uint64_t>(kMaxOutputBytes, room));
    return output_limits;
  }

  bool add_handler(const char* pattern, size_t len, int ref, const char* src, int line) {
    try {
      Handler h;
      h.pattern.assign(pattern, len);
      h.ref = ref;
      h.where = std::string(src) + ":" + std::to_string(line);
      handlers.push_back(std::move(h));
      // pattern strings moved into the vector: match against their storage
      for (Handler& x : handlers) x.matcher = TopicMatcher::of(x.pattern);
      return true;
    } catch (const std::exception& e) {
      raise_message = std::string("ballast.on: ") + e.what();
      return false;
    }
  }

  // The table at idx as the event the bus carries: the topic's well-known
  // struct, built from the table once, or JSON for any other topic.
  bool publish(lua_State* L, const char* topic, size_t len, int idx) {
    try {
      nlohmann::json event = {{"topic", std::string(topic, len)}, {"payload", nlohmann::json::object()}};
      std::string why;
      if (++output_used.values > output_limits.max_values) {
        raise_message = "ballast.publish: more than " + std::to_string(output_limits.max_values) +
                        " values in the outputs of one call";
        return false;
      }
      if (!lua_isnoneornil(L, idx) && !lua_to_json(L, idx, "", outputs_now(), &event["payload"], &why)) {
        raise_message = "ballast.publish: " + why;
        return false;
      }
      OwnedEvent out;
      if (event_from_json(event, &out, &why) != BALLAST_OK) {
        raise_message = "ballast.publish('" + std::string(topic, len) + "'): " + why;
        return false;
      }
      sink->on_publish(std::move(out));
      return true;
    } catch (const std::exception& e) {
      raise_message = std::string("ballast.publish: ") + e.what();
      return false;
    }
  }

  bool log(int level, const char* msg, size_t len) {
    try {
      if (sink != nullptr) {
        sink->on_log(level, std::string(msg, len));
      } else if (pending_logs.size() < kMaxPendingLogs) {
        pending_logs.emplace_back(level, std::string(msg, len));
      }
      return true;
    } catch (const std::exception& e) {
      raise_message = std::string("ballast.log: ") + e.what();
      return false;
    }
  }

  bool check_action(lua_State* L, int idx) {
    try {
      PolicyAction a;
      if (!read_action(L, idx, &a, &raise_message)) {
        raise_message = "ballast.action: " + raise_message;
        return false;
      }
      return true;
    } catch (const std::exception& e) {
      raise_message = std::string("ballast.action: ") + e.what();
      return false;
    }
  }

  PolicyAction fallback(const char* topic, const std::string& error) const {
    PolicyAction a;
    a.action = options.fallback_action;
    a.reason = "policy " + name + " failed on '" + topic + "': " + first_line(error, kMaxReason);
    a.args_json = "{}";
    a.cause_topic = topic;
    a.fallback = true;
    return a;
  }
};

PolicyRuntime* impl_of(lua_State* L) { return static_cast<PolicyRuntime*>(lua_touserdata(L, lua_upvalueindex(1))); }

// ballast.on(pattern, fn): at the top level only (the host subscribes to
// patterns() once the script has loaded).
int l_on(lua_State* L) {
  PolicyRuntime* m = impl_of(L);
  size_t len = 0;
  const char* pattern = luaL_checklstring(L, 1, &len);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  if (!m->loading) return luaL_error(L, "ballast.on: handlers are registered at the top level of the script only");
  if (!valid_pattern(std::string_view(pattern, len))) {
    m->raise_message = "ballast.on: " + invalid_pattern_message(std::string_view(pattern, len));
    return luaL_error(L, "%s", m->raise_message.c_str());
  }
  if (m->handlers.size() >= kMaxHandlers) return luaL_error(L, "ballast.on: more than %d handlers", int(kMaxHandlers));
  lua_Debug ar;
  lua_pushvalue(L, 2);
  lua_getinfo(L, ">S", &ar);
  lua_settop(L, 2);
  int ref = luaL_ref(L, LUA_REGISTRYINDEX);
  if (!m->add_handler(pattern, len, ref, ar.short_src, ar.linedefined)) {
    return luaL_error(L, "%s", m->raise_message.c_str());
  }
  return 0;
}

int l_publish(lua_State* L) {
  PolicyRuntime* m = impl_of(L);
  size_t len = 0;
  const char* topic = luaL_checklstring(L, 1, &len);
  int t = lua_type(L, 2);
  luaL_argexpected(L, t == LUA_TTABLE || t == LUA_TNIL || t == LUA_TNONE, 2, "table");
  if (m->sink == nullptr) return luaL_error(L, "ballast.publish: only inside a handler");
  if (!valid_topic(std::string_view(topic, len))) {
    m->raise_message = "ballast.publish: " + invalid_topic_message(std::string_view(topic, len));
    return luaL_error(L, "%s", m->raise_message.c_str());
  }
  if (!m->publish(L, topic, len, 2)) return luaL_error(L, "%s", m->raise_message.c_str());
  return 0;
}

int l_log(lua_State* L) {
  PolicyRuntime* m = impl_of(L);
  const char* level = luaL_checkstring(L, 1);
  size_t len = 0;
  const char* msg = luaL_checklstring(L, 2, &len);
  int lv = log_level(level);
  if (lv < 0) return luaL_error(L, "ballast.log: unknown level '%s' (expected error, warn, info or debug)", level);
  if (!m->log(lv, msg, len)) return luaL_error(L, "%s", m->raise_message.c_str());
  return 0;
}

int l_now(lua_State* L) {
  auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  lua_pushnumber(L, double(ns) / 1e9);
  return 1;
}

// ballast.action{...}: check an action where the script builds it (an error
// names the script's line), and return it.
int l_action(lua_State* L) {
  PolicyRuntime* m = impl_of(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  if (!m->check_action(L, 1)) return luaL_error(L, "%s", m->raise_message.c_str());
  lua_settop(L, 1);
  return 1;
}

int build_ballast(lua_State* L) {
  auto* impl = static_cast<PolicyRuntime*>(lua_touserdata(L, 1));
  static const luaL_Reg kFunctions[] = {{"on", l_on},   {"publish", l_publish}, {"log", l_log},
                                        {"now", l_now}, {"action", l_action},   {nullptr, nullptr}};
  lua_createtable(L, 0, 6);
  lua_pushlightuserdata(L, impl);
  luaL_setfuncs(L, kFunctions, 1);
  LuaSandbox::push_null(L);
  lua_setfield(L, -2, "null");
  return 1;
}

}  // namespace

struct Policy::Impl : PolicyRuntime {};

Policy::Policy() = default;
Policy::~Policy() {
  // The state goes first: its closures point at the Impl.
  if (impl_) impl_->sandbox.reset();
}

int Policy::load(const std::string& path, PolicyOptions options, std::unique_ptr<Policy>* out) {
  std::string name = options.name.empty() ? std::filesystem::path(path).stem().string() : options.name;
  std::string what = "policy " + name;
  if (!is_action(options.fallback_action)) {
    return fail(BALLAST_EINVAL,
                what + ": fallback action '" + options.fallback_action + "' is not one of " + action_names());
  }
  std::string source;
  if (int rc = read_script_file(path, what, &source); rc != BALLAST_OK) return rc;

  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->name = name;
  impl->options = std::move(options);
  impl->options.name = name;
  LuaLimits limits{impl->options.call_deadline_ms, impl->options.memory_limit_bytes};
  if (int rc = LuaSandbox::create(limits, &impl->sandbox); rc != BALLAST_OK) {
    return fail(rc, what + ": " + last_error());
  }
  std::string error;
  LuaFailure f = impl->sandbox->add_library("ballast", build_ballast, static_cast<PolicyRuntime*>(impl.get()), &error);
  if (f == LuaFailure::none) f = impl->sandbox->load(source, "@" + path, &error);
  if (f == LuaFailure::none) {
    impl->loading = true;
    f = impl->sandbox->call(0, 0, &error);
    impl->loading = false;
  }
  if (f != LuaFailure::none) {
    impl->sandbox.reset();
    return fail(lua_failure_status(f), what + ": " + error);
  }
  out->reset(new Policy());
  (*out)->impl_ = std::move(impl);
  return BALLAST_OK;
}

int Policy::reload() {
  if (impl_->sink != nullptr) {
    return fail(BALLAST_ESTATE, "policy " + impl_->name + ": reload() called from inside a handler");
  }
  std::unique_ptr<Policy> fresh;
  if (int rc = load(impl_->path, impl_->options, &fresh); rc != BALLAST_OK) return rc;
  impl_->sandbox.reset();
  impl_ = std::move(fresh->impl_);
  return BALLAST_OK;
}

std::vector<std::string> Policy::patterns() const {
  std::vector<std::string> out;
  for (const PolicyRuntime::Handler& h : impl_->handlers) out.push_back(h.pattern);
  return out;
}

int Policy::handle(const ballast_event& event, PolicySink& sink) {
  Impl& m = *impl_;
  const char* topic = event.topic != nullptr ? event.topic : "";
  if (m.sink != nullptr) {  // a sink that delivers back into this policy
    sink.on_error("policy " + m.name + ": handle() called from inside a handler; event '" + topic + "' not handled");
    return 0;
  }
  if (m.stopping.load(std::memory_order_relaxed)) {
    m.skipped.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  for (auto& [level, text] : m.pending_logs) sink.on_log(level, text);
  m.pending_logs.clear();
  m.matched.clear();
  for (size_t i = 0; i < m.handlers.size(); ++i) {
    if (m.handlers[i].matcher.matches(topic)) m.matched.push_back(i);
  }
  if (m.matched.empty()) return 0;

  lua_State* L = m.sandbox->state();
  // Leave the Lua stack and the sink as they were, whatever the sink throws.
  struct Restore {
    lua_State* L;
    int top;
    PolicyRuntime* m;
    ~Restore() {
      lua_settop(L, top);
      m->sink = nullptr;
    }
  } restore{L, lua_gettop(L), &m};
  m.sink = &sink;

  prepare_event(event, &m.conv);
  if (!m.conv.warning.empty()) sink.on_log(BALLAST_LOG_WARN, "policy " + m.name + ": " + m.conv.warning);
  std::string error;
  auto conversion_failed = [&] {
    sink.on_error("policy " + m.name + ": cannot convert event '" + topic + "' to a Lua table: " + error);
    sink.on_action(m.fallback(topic, error));
  };
  if (!lua_checkstack(L, 8)) {
    error = "Lua stack overflow";
    conversion_failed();
    return 0;
  }
  if (push_event_closure(*m.sandbox, &error) != LuaFailure::none) {
    conversion_failed();
    return 0;
  }
  const int closure = lua_gettop(L);
  LuaSandbox::push_traceback(L);
  const int traceback = lua_gettop(L);
  int ev = 0;  // the event table's slot, once a handler has run without error
  int ran = 0;
  std::string first_error;
  for (size_t i : m.matched) {
    const PolicyRuntime::Handler& h = m.handlers[i];
    LuaFailure f;
    m.actions.clear();
    m.reset_outputs();
    if (ev == 0) {  // build the table and call the handler in one protected call
      lua_pushvalue(L, closure);
      lua_pushlightuserdata(L, &m.conv);
      lua_rawgeti(L, LUA_REGISTRYINDEX, h.ref);
      m.conv.built = false;
      f = m.sandbox->call(2, 2, &error, traceback);
      if (!m.conv.built) {
        conversion_failed();
        return ran;
      }
      if (f == LuaFailure::none) {
        lua_insert(L, -2);  // [ev, result]
        ev = lua_gettop(L) - 1;
      }
    } else {
      lua_rawgeti(L, LUA_REGISTRYINDEX, h.ref);
      lua_pushvalue(L, ev);
      f = m.sandbox->call(1, 1, &error, traceback);
    }
    ++ran;
    const bool called = f == LuaFailure::none;
    if (called) {
      bool ok = false;
      try {
        ok = read_result(L, -1, topic, &m.actions, &error, m.outputs_now());
      } catch (const std::exception& e) {
        error = e.what();
      }
      lua_settop(L, ev);
      if (!ok) f = LuaFailure::runtime;
    }
    if (f != LuaFailure::none) {
      std::string msg = "policy " + m.name + ": handler for '" + h.pattern + "' (" + h.where + ") on '" + topic + "' " +
                        (called ? "returned an invalid action: " : "failed: ") + error;
      sink.on_error(msg);
      if (first_error.empty()) first_error = error;
      continue;
    }
    for (const PolicyAction& a : m.actions) sink.on_action(a);
  }
  if (!first_error.empty()) sink.on_action(m.fallback(topic, first_error));
  return ran;
}

const std::string& Policy::path() const { return impl_->path; }
const std::string& Policy::name() const { return impl_->name; }
uint64_t Policy::memory_in_use() const { return impl_->sandbox->memory_in_use(); }

void Policy::stop() {
  impl_->stopping.store(true);
  impl_->sandbox->interrupt();
}

uint64_t Policy::skipped() const { return impl_->skipped.load(std::memory_order_relaxed); }

}  // namespace ballast
