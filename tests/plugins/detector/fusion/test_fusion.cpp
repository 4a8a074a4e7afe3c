// The suspect fusion: how detectors' suspicions combine into one ranked
// list, ranks folded into nodes, old evidence fading; and `ballast suspects`
// on recorded events, bad lines named.
#include <doctest/doctest.h>

#include "fusion.hpp"
#include "fusion_json.hpp"
#include "suspects_command.hpp"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace ballast::fusion;

namespace {

constexpr int64_t kSec = 1000000000;

Suspicion report(const std::string& detector, const std::string& subject, double confidence, bool confirmed, int64_t at,
                 int32_t rank = -1) {
  Suspicion s;
  s.detector = detector;
  s.subject = subject;
  s.rank = rank;
  s.kind = detector == "hang" ? "stuck" : "outlier";
  s.confidence = confidence;
  s.confirmed = confirmed;
  s.since_ns = s.at_ns = at;
  return s;
}

struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const auto& p : paths) std::remove(p.c_str());
  }
} temp_files;

std::string write_file(const std::string& name, const std::string& text) {
  std::string p = "fusion_" + std::to_string(getpid()) + "_" + name;
  temp_files.paths.push_back(p);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

struct Run {
  int code;
  std::string out, err;
};
Run run_suspects(std::vector<std::string> args) {
  args.insert(args.begin(), "ballast suspects");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string out = write_file("stdout", ""), err = write_file("stderr", "");
  std::fflush(stdout);
  std::fflush(stderr);
  int so = dup(1), se = dup(2);
  FILE* fo = std::fopen(out.c_str(), "w");
  FILE* fe = std::fopen(err.c_str(), "w");
  dup2(fileno(fo), 1);
  dup2(fileno(fe), 2);
  int code = suspects_main(static_cast<int>(args.size()), argv.data());
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(so, 1);
  dup2(se, 2);
  close(so);
  close(se);
  std::fclose(fo);
  std::fclose(fe);
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  return {code, slurp(out), slurp(err)};
}

}  // namespace

TEST_CASE("independent detectors agreeing on a machine rank it first; one weak suspicion does not alert") {
  Fusion f(FusionConfig{});
  f.set_placement({{"m0", 0}, {"m1", 8}, {"m2", 16}});
  f.add(report("machine", "m1", 0.6, false, 10 * kSec));  // weight 0.42: not alerting alone
  auto r = f.ranking(10 * kSec);
  REQUIRE(r.size() == 1);
  CHECK(r[0].node == "m1");
  CHECK_FALSE(r[0].alerting);
  // The hang analysis names rank 19 (on m2), the straggler analysis rank 20
  // (also m2): one suspect with both detectors' evidence, above m1.
  f.add(report("hang", "rank:19", 1.0, true, 11 * kSec, 19));
  f.add_straggler(20, "worker", 1.5, 1.6, 12 * kSec, "{}");
  r = f.ranking(12 * kSec);
  REQUIRE(r.size() == 2);
  CHECK(r[0].node == "m2");
  CHECK(r[0].alerting);
  REQUIRE(r[0].evidence.size() == 2);
  CHECK(r[0].evidence[0].from.detector == "hang");
  CHECK(r[0].evidence[1].from.detector == "straggler");
  CHECK(r[0].since_ns == 11 * kSec);
  CHECK(r[1].node == "m1");
  // Corroboration: the machine detector also suspecting m1 keeps its own
  // strongest report, and m1 rises; old evidence fades with the half-life.
  f.add(report("machine", "m1", 0.9, false, 13 * kSec));
  r = f.ranking(13 * kSec);
  CHECK(r[1].evidence.size() == 1);
  CHECK(r[1].score == doctest::Approx(0.63).epsilon(0.01));
  CHECK(r[1].since_ns == 10 * kSec);      // since the first report
  r = f.ranking(13 * kSec + 240 * kSec);  // two half-lives later
  CHECK(r[1].score == doctest::Approx(0.63 / 4).epsilon(0.01));
}

TEST_CASE("without a placement, ranks stay ranks or fold by ranks_per_node; subjects are bounded") {
  Fusion plain(FusionConfig{});
  plain.add(report("hang", "rank:9", 1, true, kSec, 9));
  CHECK(plain.ranking(kSec)[0].node == "rank:9");
  FusionConfig c;
  c.ranks_per_node = 8;
  c.max_suspects = 4;
  Fusion grouped(c);
  grouped.add(report("hang", "rank:9", 1, true, kSec, 9));
  CHECK(grouped.ranking(kSec)[0].node == "rank-group:1");
  for (int i = 0; i < 100; ++i) grouped.add(report("machine", "junk" + std::to_string(i), 0.1, false, kSec));
  auto r = grouped.ranking(kSec);
  CHECK(r.size() <= 5);
  CHECK(r[0].node == "rank-group:1");  // the strong suspect is never the one dropped
}

TEST_CASE("a rank folds into the machine its reporter named, unless a placement says otherwise") {
  Suspicion hung = report("hang", "rank:9", 1, true, kSec, 9);
  hung.node = "gpu003";  // the event's source.node: the host of the rank's trace ring
  Fusion by_source(FusionConfig{});
  by_source.add(hung);
  by_source.add(report("machine", "gpu003", 0.6, false, kSec));
  auto r = by_source.ranking(kSec);
  REQUIRE(r.size() == 1);
  CHECK(r[0].node == "gpu003");
  CHECK(r[0].evidence.size() == 2);
  Fusion placed(FusionConfig{});
  placed.set_placement({{"gpu001", 0}, {"gpu002", 8}});
  placed.add(hung);
  CHECK(placed.ranking(kSec)[0].node == "gpu002");
  // From recorded events: the fault report's source.node.
  Fusion replayed(FusionConfig{});
  std::string error;
  REQUIRE(feed_event(nlohmann::json::parse("{\"topic\":\"fault.confirmed\",\"ts\":1,\"source\":{\"node\":\"gpu004\","
                                           "\"plugin\":\"hang\"},\"payload\":{\"subject\":\"rank:3\",\"rank\":3,"
                                           "\"kind\":\"stuck\",\"confidence\":1,\"stage\":1}}"),
                     &replayed, &error));
  REQUIRE(replayed.ranking(kSec).size() == 1);
  CHECK(replayed.ranking(kSec)[0].node == "gpu004");
  CHECK(replayed.ranking(kSec)[0].evidence[0].from.detector == "hang");
}

TEST_CASE("ballast suspects replays recorded events into one ranked list") {
  std::string events = write_file(
      "events.jsonl",
      "{\"topic\":\"placement.plan\",\"ts\":1700000000.0,\"payload\":{\"nodes\":[{\"name\":\"gpu001\",\"first_rank\":0}"
      ","
      "{\"name\":\"gpu002\",\"first_rank\":8}]}}\n"
      "{\"topic\":\"metric.sample\",\"ts\":1700000001.0,\"payload\":{\"samples\":[]}}\n"
      "{\"topic\":\"fault.suspected\",\"ts\":1700000003.5,\"payload\":{\"stage\":0,\"subject\":\"gpu002\",\"rank\":-1,"
      "\"kind\":\"outlier\",\"metric\":\"gpu0.util\",\"score\":6.3,\"confidence\":0.97,\"detector\":\"machine\","
      "\"evidence\":\"{\\\"z\\\":6.3}\"}}\n"
      "{\"topic\":\"fault.confirmed\",\"ts\":1700000012.0,\"payload\":{\"stage\":1,\"subject\":\"rank:11\",\"rank\":11,"
      "\"kind\":\"stuck\",\"score\":1,\"confidence\":1,\"detector\":\"hang\"}}\n"
      "{\"topic\":\"fault.suspected\",\"ts\":1700000013.0,\"payload\":{\"subject\":\"gpu001\",\"kind\":\"outlier\","
      "\"confidence\":0.5,\"detector\":\"machine\"}}\n");
  Run r = run_suspects({"--events", events});
  REQUIRE(r.code == 0);
  CHECK(r.out.find("2 suspect(s) from 5 events") != std::string::npos);
  size_t first = r.out.find("gpu002"), second = r.out.find("gpu001");
  CHECK(first < second);
  CHECK(r.out.find("ALERT") < second);  // gpu002 alerts; gpu001's weak suspicion does not
  r = run_suspects({"--events", events, "--json"});
  REQUIRE(r.code == 0);
  std::istringstream lines(r.out);
  std::string line, last;
  int n = 0;
  while (std::getline(lines, line)) ++n, last = line;
  CHECK(n == 3);  // a change at each report
  auto j = nlohmann::json::parse(last);
  CHECK(j["topic"] == "suspects.ranking");
  auto top = j["payload"]["suspects"][0];
  CHECK(top["node"] == "gpu002");
  CHECK(top["evidence"].size() == 2);
  CHECK(top["evidence"][1]["evidence"]["z"] == 6.3);  // the detector's JSON, kept as JSON
}

TEST_CASE("ballast suspects: bad lines are errors naming the file and line") {
  std::string bad = write_file("bad.jsonl", "{\"topic\":\"x\"}\n{\"topic\": nope}\n");
  Run r = run_suspects({"--events", bad});
  CHECK(r.code == 1);
  CHECK(r.err.find(bad + ":2: not JSON") != std::string::npos);
  std::string deep = write_file("deep.jsonl", std::string(100000, '[') + std::string(100000, ']') + "\n");
  r = run_suspects({"--events", deep});
  CHECK(r.code == 1);
  CHECK(r.err.find(deep + ":1: JSON nested deeper than 64 levels") != std::string::npos);
  std::string big = write_file("big.jsonl", "{\"topic\":\"fault.suspected\",\"ts\":1e3081}\n");
  r = run_suspects({"--events", big});
  CHECK(r.code == 1);
  CHECK(r.err.find(big + ":1: not JSON") != std::string::npos);
  std::string nosub = write_file("nosub.jsonl", "{\"topic\":\"fault.suspected\",\"payload\":{\"kind\":\"x\"}}\n");
  r = run_suspects({"--events", nosub});
  CHECK(r.code == 1);
  CHECK(r.err.find(nosub + ":1: payload.subject: missing") != std::string::npos);
  CHECK(run_suspects({}).code == 2);
}

TEST_CASE("a straggler report names ranks only when its kind is worker") {
  Fusion f(FusionConfig{});
  f.set_placement({{"m0", 0}, {"m1", 4}});
  // A job-wide all-reduce slowdown: every rank explains the whole of it, the
  // analysis says "random"; the ranks it lists are no suspects.
  f.add_straggler(0, "random", 1.09, 1.09, 10 * kSec, "{}");
  f.add_straggler(5, "stage", 1.09, 1.09, 10 * kSec, "{}");
  CHECK(f.ranking(10 * kSec).empty());
  f.add_straggler(5, "worker", 1.5, 1.6, 11 * kSec, "{}");
  auto r = f.ranking(11 * kSec);
  REQUIRE(r.size() == 1);
  CHECK(r[0].node == "m1");
}
