// Replacement of failed nodes (only their ranks move, spread kept low) and
// standby sizing from the InfiniteHBD fault trace.
#include <doctest/doctest.h>

#include "replace.hpp"

#include <algorithm>
#include <functional>

using namespace ballast::sched;

namespace {

const std::string kData = BALLAST_SOURCE_DIR "/tests/plugins/scheduler/data/";
const std::string kTrace = BALLAST_SOURCE_DIR "/tests/data/faults/infinitehbd-fault-trace.json";

struct Placed {
  Topology topo;
  std::vector<NodeState> state;
  Job job;
  Plan plan;
  LoadedPlan loaded;
};

Placed placed(double alpha) {
  Placed p;
  p.topo = load_topology(kData + "tree.conf");
  p.state = load_state(p.topo, kData + "state.json");
  p.job = load_job(kData + "job.json");
  p.job.alpha = alpha;
  PlaceOptions po;
  p.plan = place(p.topo, make_cluster(p.topo, p.state), p.job, po);
  p.loaded = parse_plan(plan_to_json(p.plan, p.topo, p.job).dump(), "plan.json");
  return p;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("a plan survives the JSON round trip") {
  Placed p = placed(0.3);
  REQUIRE(p.loaded.names.size() == p.plan.nodes.size());
  for (size_t r = 0; r < p.plan.nodes.size(); ++r) CHECK(p.loaded.names[r] == p.topo.nodes[p.plan.nodes[r]]);
  CHECK(p.loaded.job.alpha == doctest::Approx(0.3));
  CHECK(p.loaded.topology == kData + "tree.conf");
}

TEST_CASE("a plan event rendered as JSON (nodes only) is read with its matrix inferred") {
  Placed p = placed(0.3);
  auto full = plan_to_json(p.plan, p.topo, p.job);
  nlohmann::json bare{{"nodes", nlohmann::json::array()}};
  for (const auto& n : full["nodes"])
    bare["nodes"].push_back(
        {{"name", n["name"]}, {"pp_stage", n["pp_stage"]}, {"dp_row", n["dp_row"]}, {"first_rank", n["first_rank"]}});
  LoadedPlan lp = parse_plan(bare.dump(), "event");
  CHECK(lp.job.rows() == 6);
  CHECK(lp.job.cols() == 2);
  CHECK(lp.job.gpus_per_node == 8);
  CHECK(lp.names == p.loaded.names);
}

TEST_CASE("replacement changes only the failed nodes and prefers the failed node's minipod") {
  Placed p = placed(0.0);
  const std::string failed = p.topo.nodes[p.plan.nodes[3]];
  int fm = p.topo.node_minipod[p.plan.nodes[3]];
  ReplaceResult r = replace_nodes(p.topo, p.state, p.loaded, {failed}, {});
  REQUIRE(r.replaced.size() == 1);
  CHECK(r.replaced[0].failed == failed);
  CHECK(r.replaced[0].cell == 3);
  int spare = p.topo.find(r.replaced[0].spare);
  CHECK(p.state[spare] == kFree);
  CHECK(std::find(p.plan.nodes.begin(), p.plan.nodes.end(), spare) == p.plan.nodes.end());
  for (size_t c = 0; c < p.plan.nodes.size(); ++c)
    if (c != 3) CHECK(r.plan.nodes[c] == p.plan.nodes[c]);
  // The failed node's minipod still has free nodes: the spread cannot grow.
  bool room = false;
  for (size_t id = 0; id < p.topo.nodes.size(); ++id)
    room = room || (p.state[id] == kFree && p.topo.node_minipod[id] == fm &&
                    std::find(p.plan.nodes.begin(), p.plan.nodes.end(), static_cast<int>(id)) == p.plan.nodes.end());
  if (room) {
    CHECK(p.topo.node_minipod[spare] == fm);
    CHECK(r.plan.score.objective <= p.plan.score.objective + 1e-9);
  }
}

TEST_CASE("replacement picks, among the given spares, the one that keeps the spread lowest") {
  Placed p = placed(0.0);  // PP groups whole: alpha 0
  REQUIRE(p.plan.score.pp == 0);
  const int cell = 0;
  std::string failed = p.topo.nodes[p.plan.nodes[cell]];
  int fm = p.topo.node_minipod[p.plan.nodes[cell]];
  // One spare in the failed node's minipod, one elsewhere.
  std::string same, other;
  for (size_t id = 0; id < p.topo.nodes.size(); ++id) {
    if (p.state[id] != kFree ||
        std::find(p.plan.nodes.begin(), p.plan.nodes.end(), static_cast<int>(id)) != p.plan.nodes.end())
      continue;
    if (p.topo.node_minipod[id] == fm && same.empty()) same = p.topo.nodes[id];
    if (p.topo.node_minipod[id] != fm && other.empty()) other = p.topo.nodes[id];
  }
  REQUIRE(!other.empty());
  if (!same.empty()) {
    ReplaceResult r = replace_nodes(p.topo, p.state, p.loaded, {failed}, {other, same});
    CHECK(r.replaced[0].spare == same);
    CHECK(r.plan.score.pp == 0);
  }
  ReplaceResult forced = replace_nodes(p.topo, p.state, p.loaded, {failed}, {other});
  CHECK(forced.replaced[0].spare == other);
  CHECK(forced.plan.score.pp == 2);  // the PP group now spans two minipods
}

TEST_CASE("replacement errors") {
  Placed p = placed(0.5);
  std::string in_plan = p.topo.nodes[p.plan.nodes[1]];
  CHECK(error_of([&] { replace_nodes(p.topo, p.state, p.loaded, {"gpu01"}, {}); }) ==
        "failed node gpu01 is not in the plan");
  CHECK(error_of([&] { replace_nodes(p.topo, p.state, p.loaded, {in_plan}, {"zz9"}); }) ==
        "spare zz9 is not in " + kData + "tree.conf");
  CHECK(error_of([&] { replace_nodes(p.topo, p.state, p.loaded, {p.topo.nodes[p.plan.nodes[0]]}, {in_plan}); }) ==
        "spare " + in_plan + " is already in the plan");
  CHECK(error_of([&] { replace_nodes(p.topo, p.state, p.loaded, {in_plan}, {"gpu30"}); }) ==
        "spare gpu30 is marked faulty");
  std::vector<std::string> three{p.topo.nodes[p.plan.nodes[0]], p.topo.nodes[p.plan.nodes[1]],
                                 p.topo.nodes[p.plan.nodes[2]]};
  std::vector<std::string> two;
  for (size_t id = 0; id < p.topo.nodes.size() && two.size() < 2; ++id)
    if (p.state[id] == kFree &&
        std::find(p.plan.nodes.begin(), p.plan.nodes.end(), static_cast<int>(id)) == p.plan.nodes.end())
      two.push_back(p.topo.nodes[id]);
  CHECK(error_of([&] { replace_nodes(p.topo, p.state, p.loaded, three, two); }) == "3 failed nodes but only 2 spares");
  CHECK(error_of([&] {
          parse_plan(R"({"gpus_per_node": 8, "tp": 4, "pp": 2, "dp": 12, "alpha": 0.5, "nodes": []})", "p.json");
        }) == "p.json: \"nodes\" has 0 entries, the job needs 12");
}

TEST_CASE("standby sizing from the InfiniteHBD trace") {
  std::string trace = read_file(kTrace);
  StandbyResult r = standby_size(trace, kTrace, 1000, 99, 0, 400);
  CHECK(r.fleet == 400);
  CHECK(r.traced_nodes > 0);
  CHECK(r.traced_nodes <= 400);
  CHECK(r.days == doctest::Approx(348.9798));
  CHECK(r.max_down >= 1);
  CHECK(r.mean_down > 0);
  CHECK(r.mean_down < r.max_down);
  CHECK(r.spares >= 1);
  CHECK(r.spares >= r.expected);
  // Monotone in the percentile, the window and the job size.
  CHECK(standby_size(trace, kTrace, 1000, 50, 0, 400).spares <= r.spares);
  CHECK(standby_size(trace, kTrace, 1000, 99.9, 0, 400).spares >= r.spares);
  CHECK(standby_size(trace, kTrace, 1000, 99, 24, 400).spares >= r.spares);
  CHECK(standby_size(trace, kTrace, 4000, 99, 0, 400).spares >= r.spares);
  // Expected down nodes scale with the job.
  CHECK(standby_size(trace, kTrace, 2000, 99, 0, 400).expected == doctest::Approx(2 * r.expected));
}

TEST_CASE("standby sizing on a hand-made trace: one of four nodes down half the time") {
  std::string t = R"([{"node_id": "a", "event_time": 0, "event_type": "fault_start"},
                      {"node_id": "a", "event_time": 5, "event_type": "fault_end"},
                      {"node_id": "b", "event_time": 10, "event_type": "fault_end"}])";
  StandbyResult r = standby_size(t, "t.json", 4, 40, 0, 4);
  CHECK(r.days == 10);
  CHECK(r.mean_down == doctest::Approx(0.5));
  CHECK(r.max_down == 1);
  CHECK(r.expected == doctest::Approx(0.5));
  CHECK(r.spares == 0);  // 40% of the time: P(X=0) = 0.5 + 0.5 * 0.75^4
  CHECK(standby_size(t, "t.json", 4, 99, 0, 4).spares >= 1);
}

TEST_CASE("standby sizing rejects malformed traces and arguments") {
  CHECK(error_of([] { standby_size("[{\"node_id\": 1}]", "t.json", 10, 99, 0, 0); }) ==
        "t.json: event 0: want {\"node_id\": string, \"event_time\": days, \"event_type\": string}");
  CHECK(error_of([] {
          standby_size(R"([{"node_id": "a", "event_time": 1, "event_type": "x"}])", "t.json", 10, 99, 0, 0);
        }) == "t.json: event 0: event_type \"x\" (want fault_start or fault_end)");
  CHECK(error_of([] { standby_size("[", "t.json", 10, 99, 0, 0); }) == "t.json: line 1, column 2: malformed JSON");
  CHECK(error_of([] { standby_size("[]", "t.json", 10, 99, 0, 0); }) ==
        "t.json: expected a non-empty list of fault events");
  CHECK(error_of([] { standby_size("[]", "t.json", 10, 120, 0, 0); }) == "--percentile must be in (0, 100]");
}
