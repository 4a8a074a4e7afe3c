// libFuzzer: a Lua config file, run in the sandbox with its deadline and
// memory cap (what `ballast run CONFIG` reads first).
#include "config_file.hpp"
#include "lua_watchdog.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>

// The deadline watchdog's thread stops when the last sandbox goes and starts
// again with the next one: per input, that thread's start and join cost more
// than the config itself (about half of an execution's CPU under ASan). A
// call that is never running keeps the thread up across inputs; each
// sandbox is still watched, and its deadline enforced, as in `ballast run`.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static ballast::WatchedCall keep_watchdog_up;
  keep_watchdog_up.deadline_ms = UINT32_MAX;
  if (!ballast::watch(&keep_watchdog_up)) std::abort();  // no sandbox could be made either
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json out;
  ballast::ConfigLimits limits;
  limits.deadline_ms = 200;
  limits.memory_limit_bytes = 16 << 20;
  (void)ballast::eval_lua_table(std::string(reinterpret_cast<const char*>(data), size), true, &out, limits);
  return 0;
}
