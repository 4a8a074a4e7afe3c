// Fault-injection specs and schedules: what is accepted, and that bad input
// is refused with a message naming the argument or the file and line.
#include <doctest/doctest.h>

#include "inject.hpp"

#include <cstdio>
#include <fstream>
#include <string>

using namespace ballast::runner;

namespace {

const JobShape kShape{4, 4};

std::string error_of(const std::string& spec) {
  try {
    parse_spec(spec, "--inject '" + spec + "'", kShape);
  } catch (const InjectError& e) {
    return e.what();
  }
  return "";
}

std::string write_file(const std::string& name, const std::string& text) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp ? tmp : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("every fault kind parses into its injection") {
  auto h = parse_spec("hang:rank=2@12.5", "a", kShape);
  CHECK(h.kind == FaultKind::hang);
  CHECK(h.rank == 2);
  CHECK(h.at_s == 12.5);
  CHECK(h.spec == "hang:rank=2@12.5");
  CHECK(parse_spec("crash:rank=0@0", "a", kShape).kind == FaultKind::crash);
  CHECK(parse_spec("skip:rank=3@4", "a", kShape).kind == FaultKind::skip);
  auto s = parse_spec("slow:rank=1,factor=2.5@3", "a", kShape);
  CHECK(s.kind == FaultKind::slow);
  CHECK(s.factor == 2.5);
  auto m = parse_spec("machine:node=3,kind=mem@7", "a", kShape);
  CHECK(m.kind == FaultKind::machine);
  CHECK(m.node == 3);
  CHECK(m.machine_kind == "mem");
  auto n = parse_spec("nan@40", "a", kShape);
  CHECK(n.kind == FaultKind::nan);
  CHECK(n.at_step == 40);
  CHECK(n.at_s < 0);
  CHECK(parse_spec("usererror@9", "a", kShape).spec == "usererror@9");
  auto at_step = parse_spec("crash:rank=1@step40", "a", kShape);
  CHECK(at_step.at_step == 40);
  CHECK(at_step.at_s < 0);
  CHECK(at_step.spec == "crash:rank=1@step40");
}

TEST_CASE("bad specs are refused with the argument named") {
  CHECK(error_of("explode:rank=1@3").find("--inject 'explode:rank=1@3': unknown fault kind 'explode'") == 0);
  CHECK(error_of("crash:rank=4@3").find("rank 4 is out of range (the job has 4 ranks: 0-3)") != std::string::npos);
  CHECK(error_of("crash:rank=-1@3").find("out of range") != std::string::npos);
  CHECK(error_of("crash:rank=1").find("missing '@'") != std::string::npos);
  CHECK(error_of("crash@3").find("crash needs rank=") != std::string::npos);
  CHECK(error_of("crash:rank=1@soon").find("not a time") != std::string::npos);
  CHECK(error_of("slow:rank=1,factor=0.5@3").find("factor=0.5") != std::string::npos);
  CHECK(error_of("machine:node=9,kind=cpu@1").find("node 9 is out of range") != std::string::npos);
  CHECK(error_of("machine:node=1,kind=gpu@1").find("kind 'gpu'") != std::string::npos);
  CHECK(error_of("machine:node=1,kind=net@1").find("needs a network namespace per node: set job.netns") !=
        std::string::npos);
  CHECK(error_of("nan@0").find("step number from 1") != std::string::npos);
  CHECK(error_of("crash:rank=1,color=red@3").find("unknown argument 'color'") != std::string::npos);
}

TEST_CASE("machine kind=net is taken when the job asks for a network per node") {
  const JobShape shape{4, 4, true};
  auto m = parse_spec("machine:node=2,kind=net@step30", "a", shape);
  CHECK(m.kind == FaultKind::machine);
  CHECK(m.node == 2);
  CHECK(m.machine_kind == "net");
  CHECK(m.at_step == 30);
  CHECK(m.spec == "machine:node=2,kind=net@step30");
}

TEST_CASE("a JSON-lines schedule is read in every form, errors name the line") {
  const std::string ok = write_file("ok.jsonl",
                                    "{\"spec\": \"crash:rank=1@5\"}\n"
                                    "\n"
                                    "{\"kind\": \"hang\", \"rank\": 2, \"at\": 9}\n"
                                    "{\"kind\": \"nan\", \"step\": 30}\n"
                                    "{\"kind\": \"machine\", \"node\": 1, \"machine_kind\": \"cpu\", \"at\": 3}\n");
  auto all = parse_schedule(ok, kShape, {});
  REQUIRE(all.size() == 4);
  CHECK(all[0].spec == "crash:rank=1@5");
  CHECK(all[1].spec == "hang:rank=2@9");
  CHECK(all[2].spec == "nan@30");
  CHECK(all[3].spec == "machine:node=1,kind=cpu@3");
  CHECK(all[1].origin == ok + ":3");

  const std::string bad = write_file("bad.jsonl", "{\"spec\": \"crash:rank=1@5\"}\ncrash at 5\n");
  try {
    parse_schedule(bad, kShape, {});
    FAIL("a line that is not JSON was accepted");
  } catch (const InjectError& e) {
    CHECK(std::string(e.what()) == bad + ":2: not JSON");
  }
  const std::string range = write_file("range.jsonl", "{\"kind\": \"crash\", \"rank\": 7, \"at\": 1}\n");
  CHECK_THROWS_WITH_AS(parse_schedule(range, kShape, {}),
                       doctest::Contains((range + ":1: rank 7 is out of range").c_str()), InjectError);
  CHECK_THROWS_WITH_AS(parse_schedule("/nonexistent/schedule.jsonl", kShape, {}),
                       "/nonexistent/schedule.jsonl: cannot open the schedule file", InjectError);
}

TEST_CASE("the InfiniteHBD trace is accepted, compressed in time") {
  // Two records as JSON lines, then the published file (a JSON array).
  const std::string lines = write_file(
      "hbd.jsonl",
      R"({"node_id": "a", "event_time": 3.5, "event_type": "fault_start", "fault_type": {"Level": "Hardware Failure", "Class": "GPU", "Desc": "GPU xid Error"}})"
      "\n"
      R"({"node_id": "b", "event_time": 4.0, "event_type": "fault_start", "fault_type": {"Level": "Hardware Failure", "Class": "Parameter Plane Cable", "Desc": "Link Down"}})"
      "\n"
      R"({"node_id": "a", "event_time": 4.5, "event_type": "fault_end", "fault_type": {"Level": "Hardware Failure", "Class": "GPU", "Desc": "GPU xid Error"}})"
      "\n");
  auto in = parse_schedule(lines, kShape, {2.0});
  REQUIRE(in.size() == 2);
  CHECK(in[0].spec == "crash:rank=0@7");
  CHECK(in[0].note == "GPU: GPU xid Error");
  CHECK(in[1].spec == "hang:rank=1@8");

  const std::string trace = BALLAST_SOURCE_DIR "/../shared/data/faults/infinitehbd-fault-trace.json";
  if (!std::ifstream(trace)) {
    MESSAGE("the shared InfiniteHBD trace is not here: " << trace);
    return;
  }
  auto faults = parse_schedule(trace, kShape, {0.5});
  CHECK(faults.size() > 0);
  double last = 0;
  for (const auto& f : faults) {
    CHECK(f.at_s >= last);
    last = f.at_s;
    CHECK(f.at_s <= 348 * 0.5 + 1);
  }
  MESSAGE(faults.size() << " faults of the trace fall on a 4-node job");
}
