// libFuzzer: a what-if trace CSV, as `ballast whatif --trace` reads it.
#include "trace.hpp"

#include <stdexcept>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)ballast::straggler::parse_trace_csv(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.csv");
  } catch (const std::runtime_error&) {
  }
  return 0;
}
