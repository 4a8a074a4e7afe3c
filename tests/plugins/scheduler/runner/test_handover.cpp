// What a leader's executor carries to its successor of the job's report
// (the Slurm snapshot's "report"): the kept seconds of the lineage across a
// re-attach and a restart from a checkpoint, the bounds of the record, and
// a malformed one refused naming its field.
#include <doctest/doctest.h>

#include "handover.hpp"

#include <string>

using namespace ballast::runner;

namespace {

Lineage carried(const Lineage& l) {
  Lineage out;
  std::string error;
  REQUIRE_MESSAGE(Lineage::from_json(nlohmann::json::parse(l.to_json().dump()), &out, &error), error);
  return out;
}

}  // namespace

TEST_CASE("the lineage's kept seconds: one total to the last step and to each newest checkpoint") {
  Lineage l;
  for (int s = 1; s <= 10; ++s) l.add(s, 1.0);
  l.checkpoint(5);
  l.checkpoint(10);
  CHECK(l.seconds() == doctest::Approx(10));
  // Within a term, a restart from checkpoint 5 loses steps 6..10, trained again.
  CHECK(l.rewind(5));
  CHECK(l.seconds() == doctest::Approx(5));
  for (int s = 6; s <= 12; ++s) l.add(s, 2.0);
  l.checkpoint(10);
  CHECK(l.seconds() == doctest::Approx(19));
  const auto j = l.to_json();
  CHECK(j["step"] == 12);
  CHECK(j["checkpoints"] == nlohmann::json::parse("[[5, 5.0], [10, 15.0]]"));

  // A successor re-attached: a step the carried total holds is not counted again, the steps
  // it did not see (13, 14) are lost.
  Lineage next = carried(l);
  CHECK(next.seconds() == doctest::Approx(19));
  next.add(12, 3.0);
  next.add(15, 1.0);
  CHECK(next.seconds() == doctest::Approx(20));
  CHECK(next.last_step() == 15);
  // A successor restarted from a carried checkpoint: the total to it.
  Lineage restarted = carried(l);
  CHECK(restarted.rewind(10));
  CHECK(restarted.seconds() == doctest::Approx(15));
  // From a checkpoint past the carried step: the carried total (the steps between are lost).
  restarted = carried(l);
  CHECK(restarted.rewind(14));
  CHECK(restarted.seconds() == doctest::Approx(19));
  // From one older than the carried ones: not known, counted as 0; from the seed: 0, known.
  restarted = carried(l);
  CHECK_FALSE(restarted.rewind(3));
  CHECK(restarted.seconds() == 0);
  restarted = carried(l);
  CHECK(restarted.rewind(0));
  CHECK(restarted.seconds() == 0);
  // The newest kCheckpoints only.
  Lineage many;
  for (int s = 1; s <= 100; ++s) {
    many.add(s, 1.0);
    many.checkpoint(s);
  }
  CHECK(many.to_json()["checkpoints"].size() == Lineage::kCheckpoints);
  CHECK(many.to_json()["checkpoints"][0][0] == 100 - int(Lineage::kCheckpoints) + 1);
}

TEST_CASE("the carried report is bounded: the newest incidents, texts cut, within its bytes") {
  Handover h;
  h.start_ns = 1700000000000000000;
  h.attempts = 3;
  h.incidents_omitted = 2;
  for (int i = 0; i < 100; ++i) {
    Incident inc;
    inc.fault = "node.silent n" + std::to_string(i);
    inc.actions.assign(20, "restart: ok");
    // Two-byte characters across the cut, and invalid UTF-8 (a trainer's message).
    inc.message = "x" + std::string(300, '\0') + "\xc3\xa9\xc3\xa9\xff";
    inc.verdict = std::string(255, 'v') + "\xc3\xa9";
    h.incidents.push_back(inc);
  }
  Lineage kept;
  kept.add(1, 1.5);
  const nlohmann::json j = handover_json(h, kept);
  REQUIRE(j["incidents"].size() == Handover::kIncidents);
  CHECK(j["incidents_omitted"] == 2 + 100 - int(Handover::kIncidents));
  CHECK(j["incidents"][0]["fault"] == "node.silent n36");
  CHECK(j["incidents"][0]["actions"].size() == 8);
  CHECK(j["incidents"][0]["verdict"] == std::string(255, 'v'));  // not half a character
  const std::string dumped = j.dump();                           // strict: valid UTF-8 throughout
  CHECK(dumped.size() <= Handover::kMaxBytes);

  // Read back: the figures, the incidents numbered in order.
  Handover back;
  Lineage back_kept;
  std::string error;
  REQUIRE_MESSAGE(handover_from_json(nlohmann::json::parse(dumped), &back, &back_kept, &error), error);
  CHECK(back.start_ns == h.start_ns);
  CHECK(back.attempts == 3);
  CHECK(back.incidents_omitted == 38);
  CHECK(back.incidents.size() == j["incidents"].size());
  CHECK(back.incidents.front().id == 1);
  CHECK(back_kept.seconds() == doctest::Approx(1.5));
}

TEST_CASE("a malformed carried report is refused, naming its field") {
  Handover h;
  h.start_ns = 1700000000000000000;
  h.attempts = 2;
  h.have_loss = true;
  h.loss_first = 2.5;
  h.loss_last = 0.5;
  Incident inc;
  inc.fault = "stuck rank:1";
  inc.actions = {"restart: ok"};
  h.incidents = {inc, inc};
  Lineage kept;
  kept.add(4, 1.0);
  kept.checkpoint(4);
  const nlohmann::json good = handover_json(h, kept);
  Handover out;
  Lineage out_kept;
  std::string error;
  REQUIRE_MESSAGE(handover_from_json(good, &out, &out_kept, &error), error);
  CHECK(out.loss_first == 2.5);
  CHECK(out.incidents.size() == 2);
  CHECK(out.incidents[1].id == 2);
  CHECK(out.incidents[1].actions == std::vector<std::string>{"restart: ok"});

  const auto refused = [&](nlohmann::json j, const std::string& named) {
    error.clear();
    CHECK_FALSE(handover_from_json(j, &out, &out_kept, &error));
    CHECK_MESSAGE(error.rfind(named, 0) == 0, error);
  };
  refused(nlohmann::json::array(), "report is not an object");
  auto j = good;
  j.erase("start_ns");
  refused(j, "report.start_ns is missing or not a whole number");
  j = good;
  j["attempts"] = -1;
  refused(j, "report.attempts is missing or not a whole number of at least 0");
  j = good;
  j["loss_first"] = "2.5";
  refused(j, "report.loss_first is missing or not a number or null");
  j = good;
  j["incidents"][1]["fault"] = 7;
  refused(j, "report.incidents[1].fault is missing or not a text");
  j = good;
  j["incidents"][0]["actions"] = {1};
  refused(j, "report.incidents[0].actions[0] is missing or not a text");
  j = good;
  j["incidents"] = nlohmann::json::array();
  for (size_t i = 0; i <= Handover::kIncidents; ++i) j["incidents"].push_back(good["incidents"][0]);
  refused(j, "report.incidents is missing or not a list of at most 64 incidents");
  j = good;
  j.erase("kept");
  refused(j, "report.kept is missing or not an object");
  j = good;
  j["kept"]["seconds"] = -1;
  refused(j, "report.kept.seconds is missing or not a number of seconds");
  j = good;
  j["kept"]["checkpoints"][0] = {9, 1.0};  // past the kept step
  refused(j, "report.kept.checkpoints[0] is missing or not [step, seconds]");
  // Nothing of a refused one is read.
  CHECK(out.incidents.size() == 2);
}
