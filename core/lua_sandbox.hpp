// The Lua sandbox shared by policies and configuration files.
//
// One LuaSandbox owns one lua_State and runs one script in it:
// - Text-only chunks (mode "t"): bytecode is refused, also through `load`.
// - An allow-listed base environment: assert, error, getmetatable, ipairs,
//   next, pairs, pcall, rawequal, rawget, rawlen, select, tonumber, tostring,
//   type, _VERSION, and wrapped load (text, default env = the script's),
//   setmetatable (no __gc: finalizers run with hooks off), xpcall and
//   coroutine.wrap/close (no Lua code after the deadline's error, which
//   leaves hooks off until a pcall catches it),
//   rawset (refused on protected tables), collectgarbage ("count" only);
//   libraries string (no dump; find, match, gmatch and gsub stopped by the
//   deadline: lua_pattern.hpp; rep bounded), table (insert/remove/move
//   bounded, sort stopped by the deadline), math, utf8, coroutine, os (time, clock,
//   date, difftime). No io, os.execute/exit/getenv, require, dofile,
//   loadfile, debug, package, print.
// - Every library table is a read-only proxy; the base is reached through
//   the script's own global table, whose writes to protected names fail.
//   getmetatable("") and getmetatable(<protected>) give "protected".
// - A wall-clock deadline per call, watched by the watchdog thread
//   (lua_watchdog.hpp): past it, an instruction-count hook is set on the
//   state from the watchdog's signal and raises the error; from then on the
//   hook fires on every instruction, so a script cannot swallow the error
//   with pcall. Coroutines, and calls from threads that cannot take the
//   signal, keep a count hook every kHookEvery instructions instead.
// - A custom allocator refuses to grow the state past its memory limit
//   (the bytes Lua asked for; up to 1 MiB of freed small blocks is kept
//   for reuse on top of it).
//
// Lua raises errors with longjmp: a function that runs under lua_pcall and
// may raise (any allocating Lua API call) must have no live C++ object with
// a destructor in its frames. C++ work happens outside protected calls, or
// in a scope closed before the next raising call.
//
// Thread-safety: one thread at a time; interrupt() from any thread.
#pragma once

#include "lua_watchdog.hpp"

#include <lua.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace ballast {

struct LuaLimits {
  uint32_t deadline_ms = 100;               // wall clock per call()
  uint64_t memory_limit_bytes = 64u << 20;  // cap of the whole state
};

// Why a protected call failed.
enum class LuaFailure { none, syntax, runtime, deadline, memory };

// The BALLAST_E* status for a failure (EFORMAT, EINVAL, ETIMEDOUT, ENOMEM).
int lua_failure_status(LuaFailure failure);

// Read a script file whole. Status; the message (fail()) starts with `what`
// and names the file.
int read_script_file(const std::string& path, const std::string& what, std::string* out);

class LuaSandbox {
 public:
  static constexpr int kHookEvery = 1000;  // instructions between deadline checks where hooked

  // Create the state, open and wrap the allowed libraries. Status; the
  // message (fail()) says why.
  static int create(const LuaLimits& limits, std::unique_ptr<LuaSandbox>* out);
  ~LuaSandbox();
  LuaSandbox(const LuaSandbox&) = delete;
  LuaSandbox& operator=(const LuaSandbox&) = delete;

  lua_State* state() const { return L_; }
  const LuaLimits& limits() const { return limits_; }
  uint64_t memory_in_use() const { return used_; }
  // The deadline of the running call has passed (its error was raised).
  bool timed_out() const { return timed_out_; }

  // For C functions that loop over input (patterns, sort): raise the
  // deadline error if the running call is past its deadline, as the hook
  // would between instructions. `what` names the function.
  static void check_deadline(lua_State* L, const char* what);
  // For a C function that prepares a call's input (the event table): the
  // call's deadline counts from now.
  static void restart_deadline(lua_State* L);

  // Stop the call in progress and every later call as if past their
  // deadlines, with an "interrupted" message (thread-safe; takes effect at
  // the watchdog's next poll, within 50 ms). For a host that stops.
  void interrupt();
  bool interrupted() const;

  // Run fn(L) with a light userdata `ud` as its argument under lua_pcall
  // (for our own C code that builds tables: no deadline). Leaves nresults
  // values on the stack on success.
  LuaFailure protect(lua_CFunction fn, void* ud, int nresults, std::string* error);

  // Put the table pushed by builder(L, ud) into the base environment as a
  // read-only library named `name` (e.g. "ballast").
  LuaFailure add_library(const char* name, lua_CFunction builder, void* ud, std::string* error);

  // Compile `source` as a text chunk named `chunkname` ("@file.lua" or
  // "=name") whose _ENV is the script's global table; pushes the function.
  LuaFailure load(std::string_view source, const std::string& chunkname, std::string* error);

  // lua_pcall(nargs, nresults) with a traceback handler under the deadline.
  // On failure the function and arguments are popped and *error has the
  // message (with file:line and traceback when Lua gives them). `traceback`
  // is the stack index of a handler pushed by push_traceback() for a series
  // of calls, or 0: the call pushes and pops one itself.
  LuaFailure call(int nargs, int nresults, std::string* error, int traceback = 0);
  static void push_traceback(lua_State* L);

  // Give a new coroutine of the state its count hook (coroutines keep
  // theirs: the watchdog's signal sets a hook on the main state only).
  static void hook_coroutine(lua_State* co);

  // The value Lua scripts see as ballast.null (JSON null).
  static void push_null(lua_State* L);
  static bool is_null(lua_State* L, int idx);

 private:
  LuaSandbox() = default;
  static void* allocate(void* ud, void* ptr, size_t osize, size_t nsize);
  static void hook(lua_State* L, lua_Debug* ar);
  static void on_watchdog_signal(int);
  void stop_call(lua_State* L);
  void set_hook_mode(bool lazy);
  LuaFailure classify(int status);
  void describe(LuaFailure failure, std::string* error);

  // Small blocks (tables, strings, closures of a few words) are recycled
  // through free lists per 16-byte size class: handlers make and drop
  // several per event, and malloc/free was a third of a call's cost.
  static constexpr size_t kSmallBlock = 256;
  static constexpr size_t kMaxCachedBytes = 1u << 20;
  void* take(size_t n);
  void give_back(void* p, size_t n);
  void* free_lists_[kSmallBlock / 16 + 1] = {};
  size_t cached_bytes_ = 0;

  lua_State* L_ = nullptr;
  LuaLimits limits_;
  uint64_t used_ = 0;
  bool refused_ = false;    // the allocator refused a block during this call
  bool timed_out_ = false;  // the deadline passed during this call
  bool fast_hook_ = false;  // the hook fires on every instruction
  bool signal_ok_ = false;  // the watchdog can signal (install_watchdog_handler)
  bool lazy_hook_ = false;  // no hook until the watchdog's signal sets one
  WatchedCall watched_;
};

}  // namespace ballast
