// libFuzzer: a what-if meta.yaml (flat "key: value" lines), as `ballast whatif --meta` reads it.
#include "memfd_input.hpp"
#include "trace.hpp"

#include <stdexcept>

// Each input costs libyaml's parser 64 KiB of buffers (a 16 KiB raw input
// buffer, a 48 KiB decoded one). ASan's default 256 MiB quarantine keeps
// freed memory from reuse for thousands of inputs, so each of them gets
// fresh pages: their page faults and the allocator refilling its free lists
// took about 60% of an execution's CPU. 16 MiB still holds an input's frees
// for some hundred inputs past its end: a use after free within one input is
// caught as before.
extern "C" const char* __asan_default_options() { return "quarantine_size_mb=16"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemfdInput in(data, size);
  try {
    (void)ballast::straggler::read_meta(in.path());
  } catch (const std::runtime_error&) {
  }
  return 0;
}
