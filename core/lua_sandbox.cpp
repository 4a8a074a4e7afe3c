#include "lua_sandbox.hpp"

#include "error.hpp"
#include "lua_pattern.hpp"

#include <ballast/status.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ballast {

namespace {

// Registry keys: the addresses of these bytes.
char kBaseKey;       // the base environment (real table, never given to scripts)
char kEnvKey;        // the script's global table
char kProtectedKey;  // weak set of tables rawset must not touch
char kNullKey;       // ballast.null
char kStoppedKey;    // weak set of coroutines the deadline stopped

const char* const kInterrupted = "interrupted: the sandbox is being stopped";

// The most elements a table function may shift in one call: it runs in C,
// where the deadline hook cannot interrupt it.
constexpr lua_Unsigned kMaxShift = lua_Unsigned{1} << 22;

// The sandbox calls running on this thread, innermost first, for the
// watchdog's signal handler.
struct CallFrame {
  LuaSandbox* sandbox;
  CallFrame* outer;
};
thread_local CallFrame* t_calling __attribute__((tls_model("initial-exec"))) = nullptr;

LuaSandbox* sandbox_of(lua_State* L) {
  void* ud = nullptr;
  lua_getallocf(L, &ud);
  return static_cast<LuaSandbox*>(ud);
}

// ---- read-only tables ------------------------------------------------------

void mark_protected(lua_State* L, int idx) {
  idx = lua_absindex(L, idx);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &kProtectedKey);
  lua_pushvalue(L, idx);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

bool is_protected(lua_State* L, int idx) {
  idx = lua_absindex(L, idx);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &kProtectedKey);
  lua_pushvalue(L, idx);
  bool yes = lua_rawget(L, -2) != LUA_TNIL;
  lua_pop(L, 2);
  return yes;
}

int refuse_write(lua_State* L) {
  return luaL_error(L, "attempt to modify read-only table '%s'", lua_tostring(L, lua_upvalueindex(1)));
}

// pairs() over a proxy walks the real table without handing it out.
int readonly_next(lua_State* L) {
  lua_settop(L, 2);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_pushvalue(L, 2);
  if (lua_next(L, -2)) return 2;
  lua_pushnil(L);
  return 1;
}

int readonly_pairs(lua_State* L) {
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_pushcclosure(L, readonly_next, 1);
  lua_pushvalue(L, 1);
  lua_pushnil(L);
  return 3;
}

// Replace the table at the top with an empty proxy that reads through to it
// and refuses writes; its metatable is protected.
void make_readonly(lua_State* L, const char* name) {
  int real = lua_gettop(L);
  lua_createtable(L, 0, 0);
  lua_createtable(L, 0, 4);
  lua_pushvalue(L, real);
  lua_setfield(L, -2, "__index");
  lua_pushstring(L, name);
  lua_pushcclosure(L, refuse_write, 1);
  lua_setfield(L, -2, "__newindex");
  lua_pushvalue(L, real);
  lua_pushcclosure(L, readonly_pairs, 1);
  lua_setfield(L, -2, "__pairs");
  lua_pushliteral(L, "protected");
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
  mark_protected(L, -1);
  lua_replace(L, real);
}

// __newindex of the script's global table: its own globals are fine, the
// names of the base environment are not.
int guard_global(lua_State* L) {
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) {
    return luaL_error(L, "cannot assign to '%s': a protected name of the sandbox",
                      lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "?");
  }
  lua_settop(L, 3);
  lua_rawset(L, 1);
  return 0;
}

// ---- wrapped base functions ------------------------------------------------

int sb_setmetatable(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  int t = lua_type(L, 2);
  luaL_argexpected(L, t == LUA_TNIL || t == LUA_TTABLE, 2, "nil or table");
  if (t == LUA_TTABLE) {
    // Finalizers run with hooks off: a __gc loop could never be stopped.
    lua_pushliteral(L, "__gc");
    if (lua_rawget(L, 2) != LUA_TNIL) {
      return luaL_error(L, "setmetatable: __gc metamethods are not allowed in the sandbox");
    }
    lua_pop(L, 1);
  }
  if (luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL) {
    return luaL_error(L, "cannot change a protected metatable");
  }
  lua_settop(L, 2);
  lua_setmetatable(L, 1);
  return 1;
}

int sb_rawset(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkany(L, 2);
  luaL_checkany(L, 3);
  if (is_protected(L, 1)) return luaL_error(L, "rawset: the table is protected by the sandbox");
  lua_settop(L, 3);
  lua_rawset(L, 1);
  return 1;
}

int sb_collectgarbage(lua_State* L) {
  const char* opt = luaL_optstring(L, 1, "collect");
  if (std::strcmp(opt, "count") != 0) {
    return luaL_error(L, "collectgarbage: only \"count\" is allowed in the sandbox");
  }
  lua_pushnumber(L, lua_gc(L, LUA_GCCOUNT) + lua_gc(L, LUA_GCCOUNTB) / 1024.0);
  return 1;
}

struct ChunkReader {
  const char* next;
  size_t left;
  static const char* read(lua_State* L, void* ud, size_t* size) {
    auto* r = static_cast<ChunkReader*>(ud);
    LuaSandbox::check_deadline(L, "load");
    *size = std::min<size_t>(r->left, 64 << 10);
    const char* piece = r->next;
    r->next += *size;
    r->left -= *size;
    return *size > 0 ? piece : nullptr;
  }
};

// load(chunk [, chunkname [, mode [, env]]]): text strings only; the
// default environment is the script's global table.
int sb_load(lua_State* L) {
  if (lua_type(L, 1) != LUA_TSTRING) return luaL_argerror(L, 1, "a text chunk (string) expected");
  size_t len = 0;
  const char* chunk = lua_tolstring(L, 1, &len);
  const char* name = luaL_optstring(L, 2, "=(load)");
  const char* mode = luaL_optstring(L, 3, "t");
  if (std::strcmp(mode, "t") != 0) {
    lua_pushnil(L);
    lua_pushliteral(L, "load: only text chunks (mode \"t\") are allowed in the sandbox");
    return 2;
  }
  bool has_env = !lua_isnone(L, 4);
  // Fed to the parser in pieces, with the deadline checked between them: a
  // chunk as large as the memory cap allows takes seconds to compile in C.
  ChunkReader reader{chunk, len};
  if (lua_load(L, ChunkReader::read, &reader, name, "t") != LUA_OK) {
    lua_pushnil(L);
    lua_insert(L, -2);
    return 2;
  }
  if (has_env) {
    lua_pushvalue(L, 4);
  } else {
    lua_rawgetp(L, LUA_REGISTRYINDEX, &kEnvKey);
  }
  if (!lua_setupvalue(L, -2, 1)) lua_pop(L, 1);
  return 1;
}

// ---- bounded string and table functions -------------------------------------

// Forward every argument to the original function (upvalue 1).
int forward(lua_State* L) {
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

// string.rep(s, n) with an empty s and sep would loop n times in C; any
// other result is one allocation, which the allocator refuses past the cap.
int guarded_rep(lua_State* L) {
  size_t l = 0, lsep = 0;
  luaL_checklstring(L, 1, &l);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_optlstring(L, 3, "", &lsep);
  if (n > 0 && l + lsep == 0) {
    lua_pushliteral(L, "");
    return 1;
  }
  return forward(L);
}

// table.insert(t, pos, v) and table.remove(t, pos) shift #t - pos elements
// in C, and #t may come from a __len metamethod.
int guarded_shift(lua_State* L) {
  bool insert = lua_tointeger(L, lua_upvalueindex(2)) != 0;
  if (lua_gettop(L) == (insert ? 3 : 2)) {
    lua_Integer len = luaL_len(L, 1);
    lua_Integer pos = luaL_checkinteger(L, 2);
    if (pos >= 1 && len >= pos && lua_Unsigned(len) - lua_Unsigned(pos) > kMaxShift) {
      return luaL_error(L, "table.%s: shifting %I elements is more than the sandbox allows",
                        insert ? "insert" : "remove", len - pos);
    }
  }
  return forward(L);
}

int guarded_move(lua_State* L) {
  lua_Integer f = luaL_checkinteger(L, 2);
  lua_Integer e = luaL_checkinteger(L, 3);
  if (e >= f && lua_Unsigned(e) - lua_Unsigned(f) >= kMaxShift) {
    return luaL_error(L, "table.move: moving more than %I elements is more than the sandbox allows",
                      lua_Integer(kMaxShift));
  }
  return forward(L);
}

// table.sort(list [, comp]) as a heapsort that asks for the deadline after
// every comparison (at most 2 n log2 n of them). Lua's own sort compares in
// C with no check: a table holding one long string many times kept a
// single call comparing for hours.
bool sort_less(lua_State* L, lua_Integer i, lua_Integer j) {
  lua_geti(L, 1, i);
  lua_geti(L, 1, j);
  bool less = false;
  if (lua_isnil(L, 2)) {
    less = lua_compare(L, -2, -1, LUA_OPLT);
    lua_pop(L, 2);
  } else {
    lua_pushvalue(L, 2);
    lua_insert(L, -3);
    lua_call(L, 2, 1);
    less = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  LuaSandbox::check_deadline(L, "table.sort");
  return less;
}

void sort_swap(lua_State* L, lua_Integer i, lua_Integer j) {
  lua_geti(L, 1, i);
  lua_geti(L, 1, j);
  lua_seti(L, 1, i);
  lua_seti(L, 1, j);
}

void sift_down(lua_State* L, lua_Integer root, lua_Integer end) {
  for (;;) {
    lua_Integer child = 2 * root;
    if (child > end) return;
    if (child < end && sort_less(L, child, child + 1)) ++child;
    if (!sort_less(L, root, child)) return;
    sort_swap(L, root, child);
    root = child;
  }
}

int sb_sort(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer n = luaL_len(L, 1);
  if (n > 1) {
    luaL_argcheck(L, n < INT_MAX, 1, "array too big");
    if (!lua_isnoneornil(L, 2)) luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_settop(L, 2);
    for (lua_Integer i = n / 2; i >= 1; --i) sift_down(L, i, n);
    for (lua_Integer end = n; end > 1; --end) {
      sort_swap(L, 1, end);
      sift_down(L, 1, end - 1);
    }
  }
  return 0;
}

// ---- errors raised by the deadline hook -------------------------------------
//
// Lua runs a hook with hooks disabled and an error raised from it leaves
// them disabled until a pcall restores them. Lua code that would run in
// between (an xpcall message handler, the __close handlers of the stopped
// coroutine) would run with no deadline: it is not run.

int guarded_handler(lua_State* L) {
  if (sandbox_of(L)->timed_out()) return 1;  // the message as it is
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

int sb_xpcall(lua_State* L) {
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_pushvalue(L, 2);
  lua_pushcclosure(L, guarded_handler, 1);
  lua_replace(L, 2);
  return forward(L);
}

bool is_stopped(lua_State* L, int idx) {
  idx = lua_absindex(L, idx);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &kStoppedKey);
  lua_pushvalue(L, idx);
  bool yes = lua_rawget(L, -2) != LUA_TNIL;
  lua_pop(L, 2);
  return yes;
}

// coroutine.close(co): upvalue 1 is the original.
int sb_close(lua_State* L) {
  luaL_argexpected(L, lua_type(L, 1) == LUA_TTHREAD, 1, "coroutine");
  if (sandbox_of(L)->timed_out() || is_stopped(L, 1)) {
    return luaL_error(L, "coroutine.close: the coroutine was stopped by the deadline");
  }
  return forward(L);
}

// The function coroutine.wrap returns: upvalues are the coroutine and the
// original resume and close.
int wrapped_call(lua_State* L) {
  int n = lua_gettop(L);
  luaL_checkstack(L, 3, "coroutine.wrap");
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_insert(L, 1);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 2);
  lua_call(L, n + 1, LUA_MULTRET);
  if (lua_toboolean(L, 1)) return lua_gettop(L) - 1;
  lua_settop(L, 2);
  if (!sandbox_of(L)->timed_out()) {  // close its __close variables, as Lua's wrap does
    lua_pushvalue(L, lua_upvalueindex(3));
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_call(L, 1, 0);
  }
  return lua_error(L);
}

int sb_wrap(lua_State* L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_State* co = lua_newthread(L);
  LuaSandbox::hook_coroutine(co);
  lua_pushvalue(L, 1);
  lua_xmove(L, co, 1);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_pushcclosure(L, wrapped_call, 3);
  return 1;
}

// coroutine.create(f): upvalue 1 is the original.
int sb_create(lua_State* L) {
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  if (lua_type(L, -1) == LUA_TTHREAD) LuaSandbox::hook_coroutine(lua_tothread(L, -1));
  return 1;
}

void wrap(lua_State* L, int lib, const char* name, lua_CFunction guard, lua_Integer extra) {
  lua_getfield(L, lib, name);
  lua_pushinteger(L, extra);
  lua_pushcclosure(L, guard, 2);
  lua_setfield(L, lib, name);
}

// Copy the named fields of table `from` into table `to`.
void copy_fields(lua_State* L, int from, int to, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    lua_getfield(L, from, name);
    lua_setfield(L, to, name);
  }
}

void open_readonly(lua_State* L, int base, const char* name, lua_CFunction open) {
  luaL_requiref(L, name, open, 0);
  make_readonly(L, name);
  lua_setfield(L, base, name);
}

// Build the base environment (protected call).
int open_libraries(lua_State* L) {
  lua_settop(L, 0);
  luaL_requiref(L, LUA_GNAME, luaopen_base, 0);  // 1: the standard globals, kept from scripts
  lua_createtable(L, 0, 32);                     // 2: the base environment
  const int G = 1, base = 2;

  lua_createtable(L, 0, 8);  // the protected set, weak keys
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &kProtectedKey);
  lua_pushvalue(L, base);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &kBaseKey);

  copy_fields(L, G, base,
              {"assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall", "rawequal", "rawget", "rawlen",
               "select", "tonumber", "tostring", "type", "_VERSION"});
  lua_pushcfunction(L, sb_setmetatable);
  lua_setfield(L, base, "setmetatable");
  lua_pushcfunction(L, sb_rawset);
  lua_setfield(L, base, "rawset");
  lua_pushcfunction(L, sb_collectgarbage);
  lua_setfield(L, base, "collectgarbage");
  lua_pushcfunction(L, sb_load);
  lua_setfield(L, base, "load");
  lua_getfield(L, G, "xpcall");
  lua_pushcclosure(L, sb_xpcall, 1);
  lua_setfield(L, base, "xpcall");
  lua_createtable(L, 0, 1);  // coroutines stopped by the deadline, weak keys
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &kStoppedKey);

  // string: the library table itself is edited (it is also the strings'
  // __index), then exposed read-only.
  luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 0);
  int str = lua_gettop(L);
  lua_pushnil(L);
  lua_setfield(L, str, "dump");
  install_bounded_patterns(L, str);
  wrap(L, str, "rep", guarded_rep, 0);
  lua_pushliteral(L, "");
  lua_getmetatable(L, -1);
  lua_pushvalue(L, str);
  lua_setfield(L, -2, "__index");
  lua_pushliteral(L, "protected");
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 2);
  make_readonly(L, "string");
  lua_setfield(L, base, "string");

  luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 0);
  int tab = lua_gettop(L);
  wrap(L, tab, "insert", guarded_shift, 1);
  wrap(L, tab, "remove", guarded_shift, 0);
  wrap(L, tab, "move", guarded_move, 0);
  lua_pushcfunction(L, sb_sort);
  lua_setfield(L, tab, "sort");
  make_readonly(L, "table");
  lua_setfield(L, base, "table");

  open_readonly(L, base, LUA_MATHLIBNAME, luaopen_math);
  open_readonly(L, base, LUA_UTF8LIBNAME, luaopen_utf8);
  luaL_requiref(L, LUA_COLIBNAME, luaopen_coroutine, 0);
  int co = lua_gettop(L);
  lua_getfield(L, co, "resume");
  lua_getfield(L, co, "close");
  lua_pushcclosure(L, sb_wrap, 2);
  lua_setfield(L, co, "wrap");
  lua_getfield(L, co, "create");
  lua_pushcclosure(L, sb_create, 1);
  lua_setfield(L, co, "create");
  lua_getfield(L, co, "close");
  lua_pushcclosure(L, sb_close, 1);
  lua_setfield(L, co, "close");
  make_readonly(L, LUA_COLIBNAME);
  lua_setfield(L, base, LUA_COLIBNAME);

  luaL_requiref(L, LUA_OSLIBNAME, luaopen_os, 0);
  lua_createtable(L, 0, 4);
  copy_fields(L, lua_gettop(L) - 1, lua_gettop(L), {"time", "clock", "date", "difftime"});
  lua_remove(L, -2);
  make_readonly(L, "os");
  lua_setfield(L, base, "os");
  lua_settop(L, 0);
  return 0;
}

// The script's global table: its own globals, reads falling through to the
// base, protected names refused, rawset and setmetatable refused.
int new_env(lua_State* L) {
  lua_createtable(L, 0, 8);
  lua_pushvalue(L, -1);
  lua_setfield(L, -2, "_G");
  lua_createtable(L, 0, 3);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &kBaseKey);
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "__index");
  lua_pushcclosure(L, guard_global, 1);
  lua_setfield(L, -2, "__newindex");
  lua_pushliteral(L, "protected");
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
  mark_protected(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &kEnvKey);
  return 0;
}

struct LibraryArgs {
  const char* name;
  lua_CFunction builder;
  void* ud;
};

int install_library(lua_State* L) {
  auto* args = static_cast<LibraryArgs*>(lua_touserdata(L, 1));
  lua_pushcfunction(L, args->builder);
  lua_pushlightuserdata(L, args->ud);
  lua_call(L, 1, 1);
  luaL_checktype(L, -1, LUA_TTABLE);
  make_readonly(L, args->name);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &kBaseKey);
  lua_insert(L, -2);
  lua_setfield(L, -2, args->name);
  return 0;
}

int traceback(lua_State* L) {
  const char* msg =
      lua_isstring(L, 1) ? lua_tostring(L, 1) : lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  luaL_traceback(L, L, msg, 1);
  return 1;
}

}  // namespace

int lua_failure_status(LuaFailure failure) {
  switch (failure) {
    case LuaFailure::none:
      return BALLAST_OK;
    case LuaFailure::syntax:
      return BALLAST_EFORMAT;
    case LuaFailure::runtime:
      return BALLAST_EINVAL;
    case LuaFailure::deadline:
      return BALLAST_ETIMEDOUT;
    case LuaFailure::memory:
      return BALLAST_ENOMEM;
  }
  return BALLAST_EINTERNAL;
}

int read_script_file(const std::string& path, const std::string& what, std::string* out) {
  std::error_code ec;
  auto st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) {
    return fail(BALLAST_ENOTFOUND, what + ": cannot read '" + path + "': no such file");
  }
  if (ec || !std::filesystem::is_regular_file(st)) {
    return fail(BALLAST_EIO,
                what + ": cannot read '" + path + "': " + (ec ? ec.message() : std::string("not a regular file")));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return fail(BALLAST_EIO, what + ": cannot read '" + path + "'");
  *out = std::move(text).str();
  return BALLAST_OK;
}

int LuaSandbox::create(const LuaLimits& limits, std::unique_ptr<LuaSandbox>* out) {
  if (limits.deadline_ms == 0) return fail(BALLAST_EINVAL, "lua: the call deadline must be > 0 ms");
  std::unique_ptr<LuaSandbox> s(new LuaSandbox());
  s->limits_ = limits;
  s->L_ = lua_newstate(&LuaSandbox::allocate, s.get());
  if (s->L_ == nullptr) {
    return fail(BALLAST_ENOMEM, "lua: cannot create a state within a memory limit of " +
                                    std::to_string(limits.memory_limit_bytes) + " bytes");
  }
  s->watched_.deadline_ms = limits.deadline_ms;
  if (!watch(&s->watched_)) {
    lua_close(s->L_);
    s->L_ = nullptr;
    return fail(BALLAST_ENOMEM, "lua: cannot start the deadline watchdog thread");
  }
  s->signal_ok_ = install_watchdog_handler(&LuaSandbox::on_watchdog_signal);
  lua_sethook(s->L_, &LuaSandbox::hook, LUA_MASKCOUNT, kHookEvery);
  // Handlers make a few short-lived tables per event: the generational
  // collector suits that better than the incremental one.
  lua_gc(s->L_, LUA_GCGEN, 0, 0);
  std::string error;
  LuaFailure f = s->protect(open_libraries, s.get(), 0, &error);
  if (f != LuaFailure::none) return fail(lua_failure_status(f), "lua: " + error);
  *out = std::move(s);
  return BALLAST_OK;
}

LuaSandbox::~LuaSandbox() {
  if (L_ != nullptr) {
    unwatch(&watched_);
    lua_close(L_);
  }
  for (void*& head : free_lists_) {
    while (head != nullptr) {
      void* next = *static_cast<void**>(head);
      std::free(head);
      head = next;
    }
  }
}

void* LuaSandbox::take(size_t n) {
  if (n > kSmallBlock) return std::malloc(n);
  size_t c = (n + 15) / 16;
  if (void* p = free_lists_[c]) {
    free_lists_[c] = *static_cast<void**>(p);
    cached_bytes_ -= c * 16;
    return p;
  }
  return std::malloc(c * 16);
}

void LuaSandbox::give_back(void* p, size_t n) {
  if (n > kSmallBlock || cached_bytes_ >= kMaxCachedBytes) {
    std::free(p);
    return;
  }
  size_t c = (n + 15) / 16;
  *static_cast<void**>(p) = free_lists_[c];
  free_lists_[c] = p;
  cached_bytes_ += c * 16;
}

void* LuaSandbox::allocate(void* ud, void* ptr, size_t osize, size_t nsize) {
  auto* s = static_cast<LuaSandbox*>(ud);
  size_t old = ptr != nullptr ? osize : 0;  // with ptr == NULL, osize is a type tag
  if (nsize == 0) {
    if (ptr != nullptr) s->give_back(ptr, old);
    s->used_ -= old;
    return nullptr;
  }
  uint64_t room = s->limits_.memory_limit_bytes - std::min(s->used_, s->limits_.memory_limit_bytes);
  if (nsize > old && nsize - old > room) {
    s->refused_ = true;
    return nullptr;
  }
  void* p = nullptr;
  if (ptr == nullptr) {
    p = s->take(nsize);
  } else if (old > kSmallBlock && nsize > kSmallBlock) {
    p = std::realloc(ptr, nsize);
  } else if (old <= kSmallBlock && nsize <= kSmallBlock && (old + 15) / 16 == (nsize + 15) / 16) {
    p = ptr;  // same size class
  } else {
    p = s->take(nsize);
    if (p != nullptr) {
      std::memcpy(p, ptr, std::min(old, nsize));
      s->give_back(ptr, old);
    }
  }
  if (p == nullptr) {
    s->refused_ = true;
    return nullptr;
  }
  s->used_ = s->used_ - old + nsize;
  return p;
}

void LuaSandbox::stop_call(lua_State* L) {
  timed_out_ = true;
  // From now on every instruction raises, so that a pcall catching this
  // error cannot keep the script running.
  fast_hook_ = true;
  lua_sethook(L_, &LuaSandbox::hook, LUA_MASKCOUNT, 1);
  if (L != L_) {
    lua_sethook(L, &LuaSandbox::hook, LUA_MASKCOUNT, 1);
    lua_rawgetp(L, LUA_REGISTRYINDEX, &kStoppedKey);
    lua_pushthread(L);
    lua_pushboolean(L, 1);
    lua_rawset(L, -3);
    lua_pop(L, 1);
  }
}

bool LuaSandbox::interrupted() const { return watched_.interrupted.load(std::memory_order_relaxed); }

void LuaSandbox::hook(lua_State* L, lua_Debug* ar) {
  LuaSandbox* s = sandbox_of(L);
  if (!s->watched_.past_deadline()) {
    // Set by a signal for a call that has ended since: off again.
    if (s->lazy_hook_ && L == s->L_ && !s->fast_hook_) lua_sethook(L, nullptr, 0, 0);
    return;
  }
  s->stop_call(L);
  lua_getinfo(L, "Sl", ar);
  if (s->interrupted()) {
    lua_pushfstring(L, "%s:%d: %s", ar->short_src, ar->currentline, kInterrupted);
  } else {
    lua_pushfstring(L, "%s:%d: deadline of %d ms exceeded", ar->short_src, ar->currentline,
                    int(s->limits_.deadline_ms));
  }
  lua_error(L);
}

void LuaSandbox::check_deadline(lua_State* L, const char* what) {
  LuaSandbox* s = sandbox_of(L);
  if (!s->watched_.past_deadline()) return;
  s->stop_call(L);
  if (s->interrupted()) luaL_error(L, "%s: %s", what, kInterrupted);
  luaL_error(L, "%s: deadline of %d ms exceeded", what, int(s->limits_.deadline_ms));
}

void LuaSandbox::restart_deadline(lua_State* L) { sandbox_of(L)->watched_.restart(); }

void LuaSandbox::interrupt() { ballast::interrupt(&watched_); }

// Runs on the thread of the call the watchdog found past its deadline:
// hook every call of the thread that is past its own (lua_sethook is safe
// here; nothing else is touched).
void LuaSandbox::on_watchdog_signal(int) {
  for (CallFrame* f = t_calling; f != nullptr; f = f->outer) {
    LuaSandbox* s = f->sandbox;
    if (s->watched_.past_deadline()) lua_sethook(s->L_, &LuaSandbox::hook, LUA_MASKCOUNT, 1);
  }
}

void LuaSandbox::hook_coroutine(lua_State* co) { lua_sethook(co, &LuaSandbox::hook, LUA_MASKCOUNT, kHookEvery); }

// No hook until the watchdog's signal (lazy), or one every kHookEvery
// instructions.
void LuaSandbox::set_hook_mode(bool lazy) {
  if (lazy) {
    lua_sethook(L_, nullptr, 0, 0);
  } else {
    lua_sethook(L_, &LuaSandbox::hook, LUA_MASKCOUNT, kHookEvery);
  }
  lazy_hook_ = lazy;
  fast_hook_ = false;
}

LuaFailure LuaSandbox::classify(int status) {
  if (status == LUA_OK) return LuaFailure::none;
  if (timed_out_) return LuaFailure::deadline;
  if (status == LUA_ERRMEM || refused_) return LuaFailure::memory;
  if (status == LUA_ERRSYNTAX) return LuaFailure::syntax;
  return LuaFailure::runtime;
}

// Turn the error object at the top into *error (popping it), with the
// failure's headline when Lua's own message lacks it.
void LuaSandbox::describe(LuaFailure failure, std::string* error) {
  size_t len = 0;
  const char* msg = lua_type(L_, -1) == LUA_TSTRING ? lua_tolstring(L_, -1, &len) : nullptr;
  std::string text =
      msg != nullptr ? std::string(msg, len) : std::string("(error object is a ") + luaL_typename(L_, -1) + " value)";
  lua_pop(L_, 1);
  if (failure == LuaFailure::memory) {
    text = "memory limit of " + std::to_string(limits_.memory_limit_bytes) + " bytes reached: " + text;
  } else if (failure == LuaFailure::deadline && text.find("deadline of") == std::string::npos &&
             text.find(kInterrupted) == std::string::npos) {
    text = "deadline of " + std::to_string(limits_.deadline_ms) + " ms exceeded: " + text;
  }
  if (error != nullptr) *error = std::move(text);
}

LuaFailure LuaSandbox::protect(lua_CFunction fn, void* ud, int nresults, std::string* error) {
  refused_ = false;
  timed_out_ = false;
  if (!lua_checkstack(L_, 3)) {
    if (error != nullptr) *error = "Lua stack overflow";
    return LuaFailure::memory;
  }
  lua_pushcfunction(L_, fn);
  lua_pushlightuserdata(L_, ud);
  LuaFailure f = classify(lua_pcall(L_, 1, nresults, 0));
  if (f != LuaFailure::none) describe(f, error);
  return f;
}

LuaFailure LuaSandbox::add_library(const char* name, lua_CFunction builder, void* ud, std::string* error) {
  LibraryArgs args{name, builder, ud};
  return protect(install_library, &args, 0, error);
}

LuaFailure LuaSandbox::load(std::string_view source, const std::string& chunkname, std::string* error) {
  lua_rawgetp(L_, LUA_REGISTRYINDEX, &kEnvKey);
  bool has_env = !lua_isnil(L_, -1);
  lua_pop(L_, 1);
  if (!has_env) {
    LuaFailure f = protect(new_env, nullptr, 0, error);
    if (f != LuaFailure::none) return f;
  }
  refused_ = false;
  timed_out_ = false;
  int status = luaL_loadbufferx(L_, source.data(), source.size(), chunkname.c_str(), "t");
  if (status != LUA_OK) {
    LuaFailure f = classify(status);
    describe(f, error);
    return f;
  }
  lua_rawgetp(L_, LUA_REGISTRYINDEX, &kEnvKey);
  if (!lua_setupvalue(L_, -2, 1)) lua_pop(L_, 1);
  return LuaFailure::none;
}

LuaFailure LuaSandbox::call(int nargs, int nresults, std::string* error, int traceback_index) {
  int fidx = lua_gettop(L_) - nargs;
  if (!lua_checkstack(L_, 2)) {
    lua_settop(L_, fidx - 1);
    if (error != nullptr) *error = "Lua stack overflow";
    return LuaFailure::memory;
  }
  int msgh = traceback_index;
  if (msgh == 0) {
    lua_pushcfunction(L_, traceback);
    lua_insert(L_, fidx);
    msgh = fidx;
  }
  refused_ = false;
  timed_out_ = false;
  bool lazy = signal_ok_ && thread_receives_watchdog_signal();
  if (fast_hook_ || lazy != lazy_hook_) set_hook_mode(lazy);
  CallFrame frame{this, t_calling};
  t_calling = &frame;
  uint64_t outer_call = watched_.begin();
  int status = lua_pcall(L_, nargs, nresults, msgh);
  watched_.end(outer_call);
  t_calling = frame.outer;
  LuaFailure f = classify(status);
  if (f != LuaFailure::none) describe(f, error);
  if (traceback_index == 0) lua_remove(L_, fidx);
  return f;
}

void LuaSandbox::push_traceback(lua_State* L) { lua_pushcfunction(L, traceback); }

void LuaSandbox::push_null(lua_State* L) { lua_pushlightuserdata(L, &kNullKey); }

bool LuaSandbox::is_null(lua_State* L, int idx) {
  return lua_type(L, idx) == LUA_TLIGHTUSERDATA && lua_touserdata(L, idx) == &kNullKey;
}

}  // namespace ballast
