// Inputs sized to hurt: deep YAML, hostlists that expand to millions of
// names across a file, and long switch chains. Each is refused with the file
// and line, or handled in linear time; none crashes or takes gigabytes.
#include <doctest/doctest.h>

#include "hostlist.hpp"
#include "job.hpp"
#include "replace.hpp"
#include "topology.hpp"

#include <functional>
#include <string>

using namespace ballast::sched;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("a YAML topology of 40 KB of '[' is refused at the nesting limit, naming the file and line") {
  const std::string deep(40000, '[');
  const std::string e = error_of([&] { parse_topology_yaml(deep, "deep.yaml"); });
  CHECK_MESSAGE(contains(e, "deep.yaml:1: YAML nested deeper than 64 levels"), e);
}

TEST_CASE("hostlists are bounded per file, not per expression") {
  // Each line alone is under the per-expression bound; together they exceed the file's.
  const std::string conf =
      "SwitchName=a Nodes=n[0000000-0599999]\n"
      "SwitchName=b Nodes=m[0000000-0599999]\n";
  const std::string e = error_of([&] { parse_topology_conf(conf, "big.conf"); });
  CHECK_MESSAGE(contains(e, "big.conf:2:"), e);
  CHECK_MESSAGE(contains(e, "what is left of the file's 1000000"), e);
  // Many ranges in one bracket are counted together too.
  std::string many = "n[";
  for (int i = 0; i < 200; ++i) many += std::string(i ? "," : "") + "0000000-0009999";
  many += "]";
  CHECK(contains(error_of([&] { expand_hostlist(many); }), "more than 1000000 names"));
}

TEST_CASE("a chain of 200,000 switches is checked in linear time, and a cycle in it is found") {
  std::string conf;
  const int n = 200000;
  for (int i = 0; i < n - 1; ++i)
    conf += "SwitchName=s" + std::to_string(i) + " Switches=s" + std::to_string(i + 1) + "\n";
  conf += "SwitchName=s" + std::to_string(n - 1) + " Nodes=gpu[1-4]\n";
  // Quadratic, this took 44 s; the test's time limit is the guard (no timed
  // assertion: ASan on a loaded machine took 27 s for the linear check).
  const Topology t = parse_topology_conf(conf, "chain.conf");
  CHECK(t.nodes.size() == 4);
  // Close the chain into a ring: a cycle.
  std::string ring = conf.substr(0, conf.rfind("SwitchName=s" + std::to_string(n - 1)));
  ring += "SwitchName=s" + std::to_string(n - 1) + " Switches=s0\n";
  ring += "SwitchName=top Nodes=gpu[1-4]\n";
  CHECK(contains(error_of([&] { parse_topology_conf(ring, "ring.conf"); }), "cycle in the switch hierarchy"));
}

TEST_CASE("a number too large for a double is an input error, not a crash (found by fuzz_job_json)") {
  const std::string huge = "44444444444444444444e444444";
  CHECK(contains(error_of([&] { ballast::sched::parse_job("{\"tp\": " + huge + "}", "job.json"); }),
                 "job.json: a number too large"));
  CHECK(contains(error_of([&] { ballast::sched::parse_plan("{\"dp\": " + huge + "}", "plan.json"); }),
                 "plan.json: a number too large"));
}
