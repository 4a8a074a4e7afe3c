// libFuzzer: topology.conf (FUZZ_YAML undefined) or topology.yaml, then
// the state file against the topology read.
#include "topology.hpp"
#ifdef FUZZ_YAML
#include "small_quarantine.hpp"
#endif

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
#ifdef FUZZ_YAML
    (void)ballast::sched::parse_topology_yaml(text, "fuzz.yaml");
#else
    (void)ballast::sched::parse_topology_conf(text, "fuzz.conf");
#endif
  } catch (const ballast::sched::InputError&) {
  }
  return 0;
}
