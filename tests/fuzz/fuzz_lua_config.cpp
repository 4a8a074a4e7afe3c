// libFuzzer: a Lua config file, run in the sandbox with its deadline and
// memory cap (what `ballast run CONFIG` reads first).
#include "config_file.hpp"

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json out;
  ballast::ConfigLimits limits;
  limits.deadline_ms = 200;
  limits.memory_limit_bytes = 16 << 20;
  (void)ballast::eval_lua_table(std::string(reinterpret_cast<const char*>(data), size), true, &out, limits);
  return 0;
}
