// `ballast plan` through its command function, and the plugin itself loaded
// from its shared object: the "ballast.command" and "ballast.scheduler"
// tables, and placement requests on the bus.
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <ballast/command.h>
#include <ballast/plugin.h>
#include <ballast/scheduler.h>

#include <sys/wait.h>
#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "plan_command.hpp"
#include "topology.hpp"

namespace {

const std::string kData = BALLAST_SOURCE_DIR "/tests/plugins/scheduler/data/";
const std::string kTrace = BALLAST_SOURCE_DIR "/tests/data/faults/infinitehbd-fault-trace.json";

struct Output {
  int rc;
  std::string out, err;
};

// Run a command function with argv, capturing std::cout and std::cerr.
Output run(int (*fn)(int, char**), std::vector<std::string> args) {
  args.insert(args.begin(), "ballast plan");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::ostringstream out, err;
  auto* old_out = std::cout.rdbuf(out.rdbuf());
  auto* old_err = std::cerr.rdbuf(err.rdbuf());
  int rc = fn(static_cast<int>(args.size()), argv.data());
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  return {rc, out.str(), err.str()};
}

Output plan(std::vector<std::string> args) { return run(ballast::sched::plan_command, std::move(args)); }

std::string temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("ballast-sched-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

}  // namespace

TEST_CASE("ballast plan --json prints the plan") {
  Output o =
      plan({"--topology", kData + "tree.conf", "--job", kData + "job.json", "--state", kData + "state.json", "--json"});
  REQUIRE(o.rc == 0);
  auto j = nlohmann::json::parse(o.out);
  CHECK(j["algorithm"] == "arnold");
  CHECK(j["job"] == "demo");
  REQUIRE(j["nodes"].size() == 12);
  std::set<std::string> busy{"gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu13", "gpu14", "gpu15", "gpu30"};
  for (size_t r = 0; r < 12; ++r) {
    const auto& n = j["nodes"][r];
    CHECK(busy.count(n["name"].get<std::string>()) == 0);
    CHECK(n["pp_stage"] == static_cast<int>(r / 6));
    CHECK(n["dp_row"] == static_cast<int>(r % 6));
    CHECK(n["first_rank"] == static_cast<int>(r * 8));
  }
  for (const char* k : {"max_dp_spread", "max_pp_spread", "objective", "lower_bound", "seconds"}) CHECK(j.contains(k));
  CHECK(j["objective"].get<double>() == doctest::Approx(j["lower_bound"].get<double>()));  // small: solved exactly
  CHECK(j["optimal"] == true);
}

TEST_CASE("ballast plan reads topology.yaml and runs each baseline") {
  for (const char* a : {"best-fit", "random-fit", "slurm-tree", "heuristic", "exact"}) {
    Output o = plan({"--topology", kData + "tree.yaml", "--job", kData + "job.json", "--algorithm", a, "--json"});
    REQUIRE(o.rc == 0);
    CHECK(nlohmann::json::parse(o.out)["algorithm"] == a);
  }
  Output human = plan({"--topology", kData + "tree.yaml", "--job", kData + "job.json"});
  CHECK(human.rc == 0);
  CHECK(human.out.find("job demo: 6 rows x 2 stages, algorithm arnold") == 0);
}

TEST_CASE("--hostfile writes one line per rank in global-rank order and the rank map") {
  std::string hf = temp_path("hosts");
  Output o = plan({"--topology", kData + "tree.conf", "--job", kData + "job.json", "--json", "--hostfile", hf});
  REQUIRE(o.rc == 0);
  auto j = nlohmann::json::parse(o.out);
  std::ifstream in(hf);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 96);
  for (size_t rank = 0; rank < 96; ++rank) CHECK(lines[rank] == j["nodes"][rank / 8]["name"].get<std::string>());
  std::string env = ballast::sched::read_file(hf + ".env");
  CHECK(env.find("export SLURM_HOSTFILE='" + std::filesystem::absolute(hf).string() + "'") != std::string::npos);
  CHECK(env.find("export BALLAST_NODES='" + j["nodes"][0]["name"].get<std::string>() + " ") != std::string::npos);
  CHECK(env.find("export BALLAST_NNODES=12") != std::string::npos);
  CHECK(env.find("export BALLAST_TP=4 BALLAST_PP=2 BALLAST_DP=12") != std::string::npos);
}

TEST_CASE("ballast plan --replace changes only the failed node") {
  std::string pf = temp_path("plan.json");
  Output o =
      plan({"--topology", kData + "tree.conf", "--job", kData + "job.json", "--state", kData + "state.json", "--json"});
  REQUIRE(o.rc == 0);
  std::ofstream(pf) << o.out;
  auto before = nlohmann::json::parse(o.out);
  std::string failed = before["nodes"][4]["name"];
  Output r = plan({"--replace", pf, "--failed", failed, "--state", kData + "state.json", "--json"});
  REQUIRE(r.rc == 0);
  auto after = nlohmann::json::parse(r.out);
  CHECK(after["changed_nodes"] == 1);
  CHECK(after["replaced"][0]["failed"] == failed);
  CHECK(after["replaced"][0]["first_rank"] == 32);
  for (size_t x = 0; x < 12; ++x)
    if (x != 4) CHECK(after["nodes"][x]["name"] == before["nodes"][x]["name"]);
  CHECK(after["nodes"][4]["name"] == after["replaced"][0]["spare"]);
  Output bad = plan({"--replace", pf, "--failed", "gpu[01-"});
  CHECK(bad.rc == 1);
  CHECK(bad.err == "ballast plan: unclosed '[' in hostlist \"gpu[01-\"\n");
}

TEST_CASE("ballast plan --json records the topology's absolute path: --replace works from another folder") {
  namespace fs = std::filesystem;
  const fs::path where = fs::path(temp_path("plan-here")), other = fs::path(temp_path("plan-elsewhere"));
  fs::create_directories(where);
  fs::create_directories(other);
  fs::copy_file(kData + "tree.conf", where / "tree.conf", fs::copy_options::overwrite_existing);
  const fs::path before_cwd = fs::current_path();
  fs::current_path(where);
  Output o = plan({"--topology", "tree.conf", "--job", kData + "job.json", "--json"});
  fs::current_path(before_cwd);
  REQUIRE(o.rc == 0);
  auto j = nlohmann::json::parse(o.out);
  CHECK(j["topology"] == (where / "tree.conf").string());
  const std::string pf = (where / "plan.json").string();
  std::ofstream(pf) << o.out;
  fs::current_path(other);
  Output r = plan({"--replace", pf, "--failed", j["nodes"][0]["name"].get<std::string>(), "--json"});
  fs::current_path(before_cwd);
  CHECK(r.err == "");
  CHECK(r.rc == 0);
}

TEST_CASE("ballast plan --standby sizes spares from a fault trace") {
  Output o = plan({"--standby", "--faults", kTrace, "--nodes", "1200", "--fleet", "400", "--json"});
  REQUIRE(o.rc == 0);
  auto j = nlohmann::json::parse(o.out);
  CHECK(j["nodes"] == 1200);
  CHECK(j["percentile"] == 99.0);
  CHECK(j["spares"].get<int>() >= 1);
  CHECK(j["fleet"] == 400);
}

TEST_CASE("ballast plan errors: usage is 2, bad input is 1 with the file and line") {
  Output usage = plan({"--topology", kData + "tree.conf"});
  CHECK(usage.rc == 2);
  // (the message goes to stderr, checked through the real executable in
  // tests/plugins/common/test_command_line.cpp)
  CHECK(plan({"--standby", "--faults", kTrace}).rc == 2);
  CHECK(plan({"--bogus"}).rc == 2);
  std::string bad = temp_path("bad.conf");
  std::ofstream(bad) << "SwitchName=a Nodes=n[1-2]\nSwitchName=b Switches=zz\n";
  Output o = plan({"--topology", bad, "--job", kData + "job.json"});
  CHECK(o.rc == 1);
  CHECK(o.err == "ballast plan: " + bad + ":2: switch b lists unknown switch zz\n");
  std::string big = temp_path("big.json");
  std::ofstream(big) << R"({"gpus_per_node": 8, "tp": 8, "pp": 8, "dp": 8})";
  Output nofit = plan({"--topology", kData + "tree.conf", "--job", big});
  CHECK(nofit.rc == 1);
  CHECK(nofit.err == "ballast plan: job job needs 64 nodes (8 rows x 8 stages) but only 36 of 36 are free\n");
}

// ---- the plugin, loaded from its shared object ------------------------------

namespace {

// A small host table for one plugin, recording subscriptions and published
// events: the embedding API (host.h) does not hand out a plugin's interface
// tables, so the "ballast.scheduler" table is reached here through the
// descriptor itself. test_bus.cpp runs the plugin on the real host.
struct TestHost {
  ballast_host_api api{};
  std::map<std::string, std::string> config;
  std::map<std::string, std::pair<ballast_handler, void*>> subs;
  std::vector<nlohmann::json> plans;
  std::vector<std::string> errors;
  std::mutex mu;
};
TestHost* self(const ballast_host_api* a) { return reinterpret_cast<TestHost*>(const_cast<ballast_host_api*>(a)); }
thread_local std::string g_error;

int h_publish(const ballast_host_api* a, const ballast_event* ev) {
  TestHost* h = self(a);
  std::lock_guard<std::mutex> lock(h->mu);
  if (ev->schema == BALLAST_SCHEMA_PLACEMENT_PLAN) {
    const auto* p = static_cast<const ballast_placement_plan*>(ev->payload);
    nlohmann::json nodes = nlohmann::json::array();
    for (uint32_t i = 0; i < p->count; ++i)
      nodes.push_back({{"name", p->nodes[i].name},
                       {"pp_stage", p->nodes[i].pp_stage},
                       {"dp_row", p->nodes[i].dp_row},
                       {"first_rank", p->nodes[i].first_rank}});
    h->plans.push_back(
        {{"topic", ev->topic}, {"algorithm", p->algorithm}, {"nodes", nodes}, {"objective", p->objective}});
  } else if (ev->schema == BALLAST_SCHEMA_JSON) {
    h->errors.emplace_back(static_cast<const char*>(ev->payload), ev->payload_size);
  }
  return BALLAST_OK;
}
int h_subscribe(const ballast_host_api* a, const char* pattern, const ballast_subscribe_options*, ballast_handler fn,
                void* user, uint64_t* id) {
  self(a)->subs[pattern] = {fn, user};
  *id = self(a)->subs.size();
  return BALLAST_OK;
}
int h_unsubscribe(const ballast_host_api*, uint64_t) { return BALLAST_OK; }
void h_log(const ballast_host_api*, int, const char*) {}
int h_config_get(const ballast_host_api* a, const char* key, const char** value) {
  auto it = self(a)->config.find(key);
  if (it == self(a)->config.end()) return BALLAST_ENOTFOUND;
  *value = it->second.c_str();
  return BALLAST_OK;
}
int h_counter_add(const ballast_host_api*, const char*, int64_t) { return BALLAST_OK; }
void h_set_error(const ballast_host_api*, const char* m) { g_error = m; }
const char* h_last_error(const ballast_host_api*) { return g_error.c_str(); }

void deliver(TestHost& h, const char* topic, uint32_t schema, const void* payload, uint64_t size) {
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = schema;
  ev.topic = topic;
  ev.source.rank = -1;
  ev.payload = payload;
  ev.payload_size = size;
  auto [fn, user] = h.subs.at(topic);
  fn(user, &ev);
}

const ballast_plugin_descriptor* descriptor() {
  void* so = dlopen(BALLAST_PLUGIN_DIR "/ballast-scheduler.so", RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(so != nullptr, dlerror());
  auto entry = reinterpret_cast<ballast_plugin_entry_fn>(dlsym(so, BALLAST_PLUGIN_ENTRY));
  REQUIRE(reinterpret_cast<void*>(entry) != nullptr);
  return entry(BALLAST_ABI_MINOR);
}

void init(TestHost& h) {
  h.api.size = sizeof h.api;
  h.api.publish = h_publish;
  h.api.subscribe = h_subscribe;
  h.api.unsubscribe = h_unsubscribe;
  h.api.log = h_log;
  h.api.config_get = h_config_get;
  h.api.counter_add = h_counter_add;
  h.api.set_error = h_set_error;
  h.api.last_error = h_last_error;
  h.config["topology"] = kData + "tree.conf";
}

TEST_CASE("the plugin's minipod_level configuration, and a bad value refused at create") {
  const ballast_plugin_descriptor* d = descriptor();
  TestHost h;
  init(h);
  h.config["minipod_level"] = "2";  // minipods are the leaves of 6 nodes
  void* state = nullptr;
  REQUIRE(d->create(&h.api, &state) == BALLAST_OK);
  auto* api = static_cast<const ballast_scheduler_api*>(d->get_interface(state, BALLAST_SCHEDULER_INTERFACE, 1));
  std::string job = ballast::sched::read_file(kData + "job.json");
  ballast_placement_request req{sizeof req, 0, nullptr, job.c_str(), nullptr, nullptr, 0};
  ballast_placement_plan* p = nullptr;
  REQUIRE(api->place(state, &req, &p) == BALLAST_OK);
  auto j = nlohmann::json::parse(api->plan_json(state, p));
  CHECK(j["nodes"][0]["minipod"].get<std::string>().rfind("leaf", 0) == 0);
  api->free_plan(state, p);
  d->destroy(state);
  TestHost bad;
  init(bad);
  bad.config["minipod_level"] = "two";
  CHECK(d->create(&bad.api, &state) == BALLAST_EINVAL);
  CHECK(g_error == "config minipod_level: want an integer in [0, 64], got two");
}

}  // namespace

TEST_CASE("the plugin offers `plan`, the scheduler interface, and answers placement.request on the bus") {
  const ballast_plugin_descriptor* d = descriptor();
  CHECK(std::string(d->name) == "scheduler");
  CHECK(std::string(d->interfaces[0].name) == BALLAST_COMMAND_INTERFACE);
  CHECK(std::string(d->interfaces[1].name) == BALLAST_SCHEDULER_INTERFACE);

  TestHost h;
  init(h);
  void* state = nullptr;
  REQUIRE(d->create(&h.api, &state) == BALLAST_OK);

  auto* cmds = static_cast<const ballast_command_table*>(d->get_interface(state, BALLAST_COMMAND_INTERFACE, 1));
  REQUIRE(cmds != nullptr);
  REQUIRE(cmds->count == 1);
  CHECK(std::string(cmds->commands[0].name) == "plan");
  CHECK(d->get_interface(state, BALLAST_SCHEDULER_INTERFACE, 2) == nullptr);

  auto* api = static_cast<const ballast_scheduler_api*>(d->get_interface(state, BALLAST_SCHEDULER_INTERFACE, 1));
  REQUIRE(api != nullptr);
  std::string job = ballast::sched::read_file(kData + "job.json");
  ballast_placement_request req{sizeof req, 0, nullptr, job.c_str(), R"({"busy": ["gpu[01-10]"]})", nullptr, 0};
  ballast_placement_plan* p = nullptr;
  REQUIRE(api->place(state, &req, &p) == BALLAST_OK);
  REQUIRE(p->count == 12);
  CHECK(std::string(p->algorithm) == "arnold");
  CHECK(std::string(p->job) == "demo");
  for (uint32_t i = 0; i < p->count; ++i) {
    CHECK(p->nodes[i].first_rank == static_cast<int32_t>(i * 8));
    CHECK(std::strcmp(p->nodes[i].name, "gpu10") > 0);
  }
  std::string pj = api->plan_json(state, p);
  std::string failed = p->nodes[0].name;
  ballast_replacement_request rr{sizeof rr, 0, nullptr, nullptr, pj.c_str(), failed.c_str(), nullptr};
  ballast_placement_plan* q = nullptr;
  REQUIRE(api->replace(state, &rr, &q) == BALLAST_OK);
  CHECK(std::string(q->nodes[0].name) != failed);
  for (uint32_t i = 1; i < q->count; ++i) CHECK(std::string(q->nodes[i].name) == p->nodes[i].name);
  api->free_plan(state, q);
  api->free_plan(state, p);

  ballast_placement_request bad{sizeof bad, 0, nullptr, R"({"tp": 3})", nullptr, nullptr, 0};
  CHECK(api->place(state, &bad, &p) == BALLAST_EFORMAT);
  CHECK(g_error == "job: missing field \"gpus_per_node\"");

  // The bus: fault.confirmed marks a node faulty; placement.request answers.
  REQUIRE(d->start(state) == BALLAST_OK);
  REQUIRE(h.subs.count("placement.request") == 1);
  REQUIRE(h.subs.count("fault.confirmed") == 1);
  ballast_fault_report fr{};
  fr.size = sizeof fr;
  fr.stage = BALLAST_FAULT_CONFIRMED;
  fr.subject = "gpu11";
  fr.rank = -1;
  deliver(h, "fault.confirmed", BALLAST_SCHEMA_FAULT_REPORT, &fr, sizeof fr);
  std::string body = R"({"job": )" + job + R"(, "state": {"busy": ["gpu[01-10]"]}})";
  deliver(h, "placement.request", BALLAST_SCHEMA_JSON, body.data(), body.size());
  REQUIRE(h.plans.size() == 1);
  CHECK(h.plans[0]["topic"] == "placement.plan");
  CHECK(h.plans[0]["nodes"].size() == 12);
  for (const auto& n : h.plans[0]["nodes"]) CHECK(n["name"] != "gpu11");
  // A policy asks for a replacement with the plan event it saw (nodes only).
  nlohmann::json ask{
      {"replace",
       {{"plan", {{"nodes", h.plans[0]["nodes"]}}}, {"failed", h.plans[0]["nodes"][5]["name"]}, {"alpha", 0.3}}}};
  std::string ask_body = ask.dump();
  deliver(h, "placement.request", BALLAST_SCHEMA_JSON, ask_body.data(), ask_body.size());
  REQUIRE(h.plans.size() == 2);
  CHECK(h.plans[1]["algorithm"] == "replace");
  for (size_t x = 0; x < 12; ++x) {
    if (x == 5)
      CHECK(h.plans[1]["nodes"][x]["name"] != h.plans[0]["nodes"][x]["name"]);
    else
      CHECK(h.plans[1]["nodes"][x]["name"] == h.plans[0]["nodes"][x]["name"]);
    CHECK(h.plans[1]["nodes"][x]["name"] != "gpu11");  // still faulty
  }
  std::string broken = R"({"job": {"gpus_per_node": 8, "tp": 4, "pp": 2, "dp": 11}})";
  deliver(h, "placement.request", BALLAST_SCHEMA_JSON, broken.data(), broken.size());
  REQUIRE(h.errors.size() == 1);
  CHECK(h.errors[0].find("dp*tp=44 is not a multiple of gpus_per_node=8") != std::string::npos);
  d->stop(state);
  d->destroy(state);
}

// ---- end to end: the real `ballast` executable ------------------------------

namespace {

// Run a shell command, returning its exit status and stdout (+ stderr).
Output shell(const std::string& cmd) {
  Output o{-1, "", ""};
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(f != nullptr);
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) o.out.append(buf, got);
  int status = ::pclose(f);
  o.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

}  // namespace

TEST_CASE("`ballast plan` through the real executable") {
  Output o = shell(std::string(BALLAST_EXE) + " plan --topology " + kData + "tree.yaml --job " + kData +
                   "job.json --state " + kData + "state.json --json");
  REQUIRE(o.rc == 0);
  auto j = nlohmann::json::parse(o.out);
  CHECK(j["algorithm"] == "arnold");
  CHECK(j["nodes"].size() == 12);
  CHECK(j["optimal"] == true);
  Output bad = shell(std::string(BALLAST_EXE) + " plan --topology " + kData + "job.json --job " + kData + "job.json");
  CHECK(bad.rc == 1);
  CHECK(bad.out.find(kData + "job.json:1: expected Key=Value") != std::string::npos);
}
