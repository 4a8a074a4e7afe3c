// Lua string patterns for the sandbox: string.find, match, gmatch and gsub
// with the behaviour Lua 5.4's manual gives them (§6.4.1), written so that
// the sandbox's deadline stops them.
//
// Lua's own pattern functions run in C, where the deadline hook cannot fire,
// and their backtracking is exponential in the pattern (("a?"):rep(30) ..
// ("a"):rep(30)) or polynomial of a high degree ("(.-)(.-)(.-)x"): one call
// could run for hours. These count their steps (characters tried, matches
// attempted, bytes compared or copied) and every kCheckEvery steps ask the
// sandbox whether the call is past its deadline; past it, the call fails
// with the deadline error as Lua code would (LuaSandbox::check_deadline).
// Matching recursion is bounded as Lua bounds it (200 levels: "pattern too
// complex"), captures too (32).
#pragma once

#include <lua.hpp>

namespace ballast {

// Replace find, match, gmatch and gsub in the table at `string_lib` (the
// string library, before it is made read-only).
void install_bounded_patterns(lua_State* L, int string_lib);

}  // namespace ballast
