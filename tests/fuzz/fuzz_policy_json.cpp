// libFuzzer: a JSON event payload as a Lua policy reads it (the tape parser
// of core/lua_json), against nlohmann::json's parser, which checks UTF-8
// as strictly: what the tape accepts nlohmann accepts, what the tape
// refuses for its UTF-8 nlohmann refuses; what is accepted becomes Lua
// tables, and back as JSON it dumps without a string to refuse.
#include "lua_json.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace {

struct PushArgs {
  const ballast::JsonTape* tape;
  int root;
};

int push(lua_State* L) {
  const auto* a = static_cast<const PushArgs*>(lua_touserdata(L, 1));
  a->tape->push(L, a->root);
  return 1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static lua_State* L = luaL_newstate();
  static ballast::JsonTape tape;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  tape.clear();
  std::string error;
  const int root = tape.parse(text, &error);
  const bool theirs = nlohmann::json::accept(text);
  if (root < 0) {
    if (error.find("UTF-8") != std::string::npos && theirs) __builtin_trap();
    return 0;
  }
  if (!theirs) __builtin_trap();
  PushArgs args{&tape, root};
  lua_settop(L, 0);
  lua_pushcfunction(L, push);
  lua_pushlightuserdata(L, &args);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) return 0;  // out of memory
  nlohmann::json back;
  if (ballast::lua_to_json(L, -1, "payload", ballast::JsonLimits{}, &back, &error)) {
    (void)back.dump();  // throws at a string that is not valid UTF-8
  }
  lua_settop(L, 0);
  return 0;
}
