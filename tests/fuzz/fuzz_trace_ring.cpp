// libFuzzer: a trace ring file (abi/ballast/trace.h), as `ballast analyze` reads one.
#include "memfd_input.hpp"
#include "rings.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemfdInput in(data, size);
  ballast::hang::RankRing ring;
  std::string error;
  if (ballast::hang::read_ring(in.path(), &ring, &error)) {
    std::vector<ballast::hang::RankRing> parts{ring, ring};
    (void)ballast::hang::merge_rings(std::move(parts));
  }
  return 0;
}
