// libFuzzer: a what-if meta.yaml (flat "key: value" lines), as `ballast whatif --meta` reads it.
#include "memfd_input.hpp"
#include "small_quarantine.hpp"
#include "trace.hpp"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemfdInput in(data, size);
  try {
    (void)ballast::straggler::read_meta(in.path());
  } catch (const std::runtime_error&) {
  }
  return 0;
}
