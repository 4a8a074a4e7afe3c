// libFuzzer: a job description (job.json) and a state file (state.json)
// against a small fixed topology.
#include "job.hpp"
#include "topology.hpp"

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ballast::sched::Topology topo =
      ballast::sched::parse_topology_conf("SwitchName=s Nodes=gpu[001-016]\n", "fixed.conf");
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)ballast::sched::parse_job(text, "job.json");
  } catch (const ballast::sched::InputError&) {
  }
  try {
    (void)ballast::sched::parse_state(topo, text, "state.json");
  } catch (const ballast::sched::InputError&) {
  }
  return 0;
}
