// libFuzzer: a safetensors file's header (length, JSON, tensors), as
// `ballast startup load` checks it before reading a byte of data.
#include "memfd_input.hpp"
#include "striped_read.hpp"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemfdInput in(data, size);
  try {
    (void)ballast::startup::parse_safetensors_header("fuzz.safetensors", in.fd(), size);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
