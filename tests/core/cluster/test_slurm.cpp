// The Slurm side of recovery against a real 4-node Slurm (tools/engines/
// slurm-up: munged, slurmctld and four slurmd on ports of their own): a
// trainer that checkpoints each step runs on two nodes; a node fault (here
// the test stands in for Ballast's heartbeat detector) ends with the node
// drained under a reason naming the fault, the job requeued without it and
// training resumed from its checkpoint; then a warm spare held in a
// reservation replaces a second faulty node through --nodelist; then the
// repaired nodes are resumed. The last case runs the same chain through
// Ballast itself: agents' heartbeats, the controller's node.silent, the
// policy's evict and the executor's Slurm backend.
#include "cluster_harness.hpp"
#include "config_file.hpp"
#include "error.hpp"
#include "host.hpp"
#include "host_config.hpp"
#include "journal.hpp"
#include "slurm.hpp"
#include "slurm_backend.hpp"
#include "test_ports.hpp"

#include <ballast/events.h>
#include <ballast/status.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

using namespace cluster_test;
using ballast::slurm::JobInfo;
using ballast::slurm::NodeInfo;
using ballast::slurm::Slurm;

namespace {

std::string trainer_script(const std::string& dir) {
  return "#!/bin/bash\n"
         "ck=" +
         dir +
         "/ckpt; step=0; [ -f $ck ] && step=$(cat $ck)\n"
         "echo \"start restart=${SLURM_RESTART_COUNT:-0} nodes=$SLURM_JOB_NODELIST from_step=$step\"\n"
         "while [ $step -lt 40 ]; do sleep 0.1; step=$((step+1)); echo $step > $ck.tmp && mv $ck.tmp $ck; done\n"
         "echo \"done step=$step\"\n";
}

int checkpoint(const std::string& dir) {
  std::string s = read_file(dir + "/ckpt");
  return s.empty() ? 0 : std::atoi(s.c_str());
}

// Waits until the job is in `state`, or in an end state it cannot leave.
JobInfo wait_job(Slurm& slurm, long id, const std::string& state, double timeout_s) {
  JobInfo info;
  std::string error;
  eventually(timeout_s, [&] {
    return slurm.job(id, &info, &error) &&
           (info.state == state || info.state == "COMPLETED" || info.state == "FAILED" || info.state == "CANCELLED" ||
            info.state == "NODE_FAIL" || info.state == "TIMEOUT");
  });
  return info;
}

// What slurmctld said about the job, for a failure's message.
std::string ctld_log(const Cluster& c) {
  std::istringstream in(read_file(c.dir + "/log/slurmctld.log"));
  std::string out;
  for (std::string line; std::getline(in, line);)
    if (line.find("JobId=") != std::string::npos) out += line + "\n";
  return out;
}

NodeInfo node(Slurm& slurm, const std::string& name) {
  std::vector<NodeInfo> all;
  std::string error;
  REQUIRE_MESSAGE(slurm.nodes(&all, &error), error);
  for (auto& n : all)
    if (n.name == name) return n;
  FAIL("no node " << name);
  return {};
}

}  // namespace

TEST_CASE("node fault on Slurm: drained, requeued without it, resumed from the checkpoint; a spare replaces the next") {
  Cluster c;
  REQUIRE_MESSAGE(c.up, "slurm-up failed: " << read_file(c.dir + "/log/slurmctld.log"));
  Slurm slurm(c.conf);
  std::string error;
  REQUIRE_MESSAGE(slurm.hold_spares("spares", {"n4"}, &error), error);
  write_file(c.dir + "/train.sh", trainer_script(c.dir));
  long job = 0;
  REQUIRE_MESSAGE(
      slurm.submit({"-N2", "--requeue", "--open-mode=append", "-o", c.dir + "/job.out", c.dir + "/train.sh"}, &job,
                   &error),
      error);
  JobInfo info = wait_job(slurm, job, "RUNNING", 15);
  INFO("slurmctld: " << ctld_log(c));
  REQUIRE(info.state == "RUNNING");
  std::vector<std::string> nodes;
  REQUIRE(slurm.expand(info.nodes, &nodes, &error));
  REQUIRE(nodes.size() == 2);
  CHECK(std::find(nodes.begin(), nodes.end(), "n4") == nodes.end());  // the spare stays out of normal jobs
  REQUIRE(eventually(15, [&] { return checkpoint(c.dir) >= 5; }));

  // Fault 1: evict and restart without the node.
  const std::string bad = nodes[0];
  REQUIRE_MESSAGE(slurm.drain(bad, "ballast: node.silent " + bad, &error), error);
  REQUIRE_MESSAGE(slurm.requeue_excluding(job, {bad}, &error), error);
  info = wait_job(slurm, job, "RUNNING", 15);
  REQUIRE(info.state == "RUNNING");
  CHECK(info.restarts == 1);
  std::vector<std::string> now;
  REQUIRE(slurm.expand(info.nodes, &now, &error));
  CHECK(std::find(now.begin(), now.end(), bad) == now.end());
  CHECK(std::find(now.begin(), now.end(), "n4") == now.end());
  NodeInfo drained = node(slurm, bad);
  CHECK(drained.drained());
  CHECK(drained.reason == "ballast: node.silent " + bad);

  // Fault 2: the spare replaces a node, given through the placement's node list.
  REQUIRE(eventually(15, [&] { return checkpoint(c.dir) >= 15; }));
  const std::string bad2 = now[0], survivor = now[1];
  REQUIRE(slurm.drain(bad2, "ballast: xid 79 on " + bad2, &error));
  REQUIRE_MESSAGE(slurm.requeue_onto(job, "spares", {survivor, "n4"}, &error), error);
  info = wait_job(slurm, job, "RUNNING", 15);
  REQUIRE(info.state == "RUNNING");
  CHECK(info.restarts == 2);
  REQUIRE(slurm.expand(info.nodes, &now, &error));
  std::sort(now.begin(), now.end());
  std::vector<std::string> want = {survivor, "n4"};
  std::sort(want.begin(), want.end());
  CHECK(now == want);

  info = wait_job(slurm, job, "COMPLETED", 30);
  CHECK(info.state == "COMPLETED");
  std::string out = read_file(c.dir + "/job.out");
  INFO(out);
  // Three starts: the first from step 0, each restart from its checkpoint, and the end reached once.
  CHECK(out.find("restart=0 nodes=") != std::string::npos);
  CHECK(out.find("restart=1 nodes=") != std::string::npos);
  CHECK(out.find("restart=2 nodes=") != std::string::npos);
  CHECK(out.find("from_step=0\n") == out.rfind("from_step=0\n"));
  size_t r1 = out.find("restart=1");
  int resumed = std::atoi(out.c_str() + out.find("from_step=", r1) + 10);
  CHECK(resumed >= 5);
  CHECK(out.find("done step=40") != std::string::npos);

  // Repaired: both return to service.
  REQUIRE(slurm.resume(bad, &error));
  REQUIRE(slurm.resume(bad2, &error));
  CHECK(!node(slurm, bad).drained());
  CHECK(!node(slurm, bad2).drained());
}

TEST_CASE("Slurm command failures are named, never taken for success") {
  Cluster c;
  REQUIRE(c.up);
  Slurm slurm(c.conf);
  std::string error;
  CHECK_FALSE(slurm.drain("nosuchnode", "x", &error));
  CHECK(error.find("scontrol update NodeName=nosuchnode") != std::string::npos);
  CHECK(error.find("exit code") != std::string::npos);
  JobInfo info;
  CHECK_FALSE(slurm.job(999999, &info, &error));
  CHECK_FALSE(slurm.requeue_excluding(999999, {"n1"}, &error));
  CHECK(error.find("requeue") != std::string::npos);
  Slurm nowhere(c.dir + "/missing.conf", 5000);
  std::vector<NodeInfo> all;
  CHECK_FALSE(nowhere.nodes(&all, &error));
}

namespace {

const std::string kBallast = BALLAST_EXE;
const std::string kTrainer = BALLAST_SOURCE_DIR "/tests/plugins/scheduler/runner/channel_trainer.py";

std::vector<nlohmann::json> json_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line, nullptr, false));
  return out;
}

// The job's end under the controller ctl: trained to the end (its final weights written), the
// controller's report in `out`, the controller exited 0; the agents stopped. Returns the report.
nlohmann::json finished_job(const std::string& job_dir, const std::string& out, Proc& ctl,
                            std::initializer_list<Proc*> agents) {
  REQUIRE(eventually(60, [&] { return !read_file(job_dir + "/final-weights.json").empty(); }));
  REQUIRE(eventually(30, [&] { return read_file(out).find("\"state\"") != std::string::npos; }));
  CHECK(ctl.wait() == 0);
  for (Proc* a : agents) {
    a->signal(SIGTERM);
    a->wait();
  }
  auto report = nlohmann::json::parse(read_file(out), nullptr, false);
  REQUIRE(report.is_object());
  return report;
}

}  // namespace

TEST_CASE(
    "node fault through the executor: node.silent, the policy's evict, drained, requeued onto the spare, resumed; "
    "the node resumed in Slurm on node.back; a crash restarted") {
  Cluster c;
  REQUIRE_MESSAGE(c.up, "slurm-up failed: " << read_file(c.dir + "/log/slurmctld.log"));
  const std::string certs = c.dir + "/certs";
  REQUIRE(sh(engines() + "/make-certs " + certs + " 127.0.0.1 -- n1 n2") == 0);
  const std::string listen = "127.0.0.1:" + std::to_string(c.port + 50);
  // The policy of a Slurm job with warm spares: a silent node is evicted and replaced, a crashed rank restarted.
  write_file(c.dir + "/policy.lua",
             "ballast.on(\"node.silent\", function(ev)\n"
             "  local node = (ev.payload or {}).subject or ev.source.node\n"
             "  local why = \"node.silent \" .. tostring(node)\n"
             "  return {{action = \"evict\", subject = node, reason = why},\n"
             "          {action = \"replace\", subject = node, reason = why}}\n"
             "end)\n"
             "ballast.on(\"fault.confirmed\", function(ev)\n"
             "  return {action = \"restart\", reason = \"crashed\"}\n"
             "end)\n");
  const std::string job_dir = c.dir + "/job";
  write_file(
      c.dir + "/controller.lua",
      "return { node = \"ctl\", role = \"controller\", journal = \"" + c.dir +
          "/bus.journal\",\n"
          "  plugins = { { path = \"runner\", config = { inject = { \"crash:rank=1@step60\" } } }, \"scheduler\" },\n"
          "  job = { backend = \"slurm\", ranks = 2, standby = 1, dir = \"" +
          job_dir +
          "\", progress = false,\n"
          "    command = { \"python3\", \"" +
          kTrainer +
          "\", \"--steps\", \"120\", \"--step-seconds\", \"0.1\",\n"
          "                \"--checkpoint-every\", \"5\" },\n"
          "    repair_seconds = 3, placement_timeout_seconds = 5,\n"
          "    slurm = { conf = \"" +
          c.conf +
          "\", nodes = { \"n1\", \"n2\" }, spares = { \"n4\" },\n"
          "              reservation = \"ballast-spares\" } },\n"
          "  policy = { script = \"" +
          c.dir +
          "/policy.lua\", fallback = \"escalate\" },\n"
          "  cluster = { listen = \"" +
          listen + "\", " + tls_table(certs, "controller") +
          ",\n"
          "    ingest_journal = \"" +
          c.dir +
          "/ingest.journal\", durable = false,\n"
          "    heartbeat_ms = 250, silent_after_ms = 3000 } }\n");
  auto agent = [&](const std::string& node) { return start_agent(c.dir, certs, listen, node, 3000); };
  Proc ctl = spawn({kBallast, "run", c.dir + "/controller.lua", "--json"}, c.dir + "/ctl.out", c.dir + "/ctl.err");
  Proc a1 = agent("n1"), a2 = agent("n2");
  Slurm slurm(c.conf);
  std::string error;
  auto connected = [&](const std::string& node) {
    return read_file(c.dir + "/ctl.err").find("node " + node + " connected") != std::string::npos;
  };
  const bool up = eventually(30, [&] {
    return connected("n1") && connected("n2") && !read_file(job_dir + "/checkpoints/step-00000005.safetensors").empty();
  });
  INFO("controller: " << read_file(c.dir + "/ctl.err"));
  REQUIRE(up);

  // The node fault: n1's agent dies (as with its machine); only Ballast's heartbeats tell.
  a1.signal(SIGKILL);
  a1.wait();
  NodeInfo drained;
  REQUIRE(eventually(30, [&] {
    drained = node(slurm, "n1");
    return drained.drained();
  }));
  CHECK(drained.reason.find("node.silent n1") != std::string::npos);

  // Repaired by event, not by time: n1 stays drained past repair_seconds (3) while its agent is
  // gone, and is resumed in Slurm once its agent is back (the controller's node.back).
  std::this_thread::sleep_for(std::chrono::seconds(5));
  CHECK(node(slurm, "n1").drained());
  a1 = agent("n1");
  CHECK(eventually(30, [&] { return !node(slurm, "n1").drained(); }));

  // The job ends by itself, trained to the end; the controller exits with it.
  const auto report = finished_job(job_dir, c.dir + "/ctl.out", ctl, {&a1, &a2});
  CHECK(report["state"] == "finished");
  CHECK(report["attempts"] == 3);
  // Without etcd the host's fence lets every Slurm operation run: each asked (submit, drain,
  // requeue, release, signal, resume, cancel), none refused.
  CHECK(report["counters"].value("fence.allowed", 0) >= 7);
  CHECK(report["counters"].value("fence.refused", 0) == 0);
  CHECK(report["counters"].value("runner.fenced_off", 0) == 0);

  // Slurm's view: one batch job; its second run on n2 and the spare n4, never on n1; the crash's
  // restart (rank 1 killed through `srun kill`) its third, on the same nodes.
  const std::string out = read_file(job_dir + "/slurm/job.out");
  INFO(out);
  CHECK(out.find("ballast: run 0, restart 0, nodes n[1-2]") != std::string::npos);
  CHECK(out.find("ballast: run 1, restart 1, nodes n[2,4]") != std::string::npos);
  CHECK(out.find("ballast: run 2, restart 2, nodes n[2,4]") != std::string::npos);
  CHECK(out.find("restart 3") == std::string::npos);

  // Every action once, by count: one evict, one replace, one restart, each started and ended once, all ok.
  std::map<uint64_t, int> starts, ends;
  std::map<std::string, int> ok;
  std::string replace_detail;
  for (const auto& j : json_lines(job_dir + "/actions.jsonl")) {
    REQUIRE(j.is_object());
    if (j["event"] == "start") starts[j["id"].get<uint64_t>()]++;
    if (j["event"] != "end") continue;
    ends[j["id"].get<uint64_t>()]++;
    if (j["outcome"] != "ok") continue;  // the policy's replace may come after the evict's own: superseded
    ok[j["action"].get<std::string>()]++;
    if (j["action"] == "replace") replace_detail = j["detail"].get<std::string>();
  }
  for (const auto& [id, n] : starts) CHECK_MESSAGE(n == 1, "action " << id << " started " << n << " times");
  for (const auto& [id, n] : ends) CHECK_MESSAGE(n == 1, "action " << id << " ended " << n << " times");
  CHECK(ok["evict"] == 1);
  CHECK(ok["replace"] == 1);
  CHECK(ok["restart"] == 1);
  CHECK(ok.size() == 3);
  CHECK(bus_count(c.dir + "/bus.journal", "node.silent", "n1") == 1);
  CHECK(bus_count(c.dir + "/bus.journal", "node.back", "n1") == 1);
  INFO("replace: " << replace_detail);
  CHECK(replace_detail.find("n1 -> n4") != std::string::npos);

  // Resumed from its checkpoint: the step it went back to, and the final weights of a run never interrupted.
  const size_t at = replace_detail.find("from step ");
  REQUIRE(at != std::string::npos);
  CHECK(std::atoi(replace_detail.c_str() + at + 10) >= 5);
  const auto weights = nlohmann::json::parse(read_file(job_dir + "/final-weights.json"), nullptr, false);
  double w = 1.0;
  for (int n = 1; n <= 120; ++n) w = std::fmod(w * 1.0001 + n * 1e-3, 1000.0);
  CHECK(weights["step"] == 120);
  CHECK(std::abs(weights["w"].get<double>() - w) < 1e-9);

  // n1 still resumed in Slurm (it went back among the spares, whose reservation the job deleted
  // at its end).
  CHECK(!node(slurm, "n1").drained());
  std::vector<std::string> held;
  CHECK(slurm.reservation_nodes("ballast-spares", &held, &error));
  CHECK(held.empty());
}

TEST_CASE(
    "with etcd, the leader's executor acts on Slurm and a deposed leader's does not: its drain refused by the fence, "
    "the node not drained, the job neither requeued nor cancelled") {
  Cluster c;
  REQUIRE_MESSAGE(c.up, "slurm-up failed: " << read_file(c.dir + "/log/slurmctld.log"));
  const ClusterEtcd etcd_server(c);
  REQUIRE_MESSAGE(etcd_server.up, "etcd did not start: " << read_file(etcd_server.dir + "/stdout.log"));
  const std::string& etcd = etcd_server.endpoint;
  const std::string certs = c.dir + "/certs";
  REQUIRE(sh(engines() + "/make-certs " + certs + " 127.0.0.1 -- n1 n2") == 0);
  const std::string listen = "127.0.0.1:" + std::to_string(c.port + 50);
  const std::string job_key = "test" + std::to_string(getpid());  // controller_config's etcd.job: c2 campaigns too
  write_file(c.dir + "/policy.lua",
             "ballast.on(\"node.silent\", function(ev)\n"
             "  local node = (ev.payload or {}).subject or ev.source.node\n"
             "  return {action = \"evict\", subject = node, reason = \"node.silent \" .. tostring(node)}\n"
             "end)\n");
  const std::string job_dir = c.dir + "/job";
  write_file(c.dir + "/c1.lua",
             "return { node = \"c1\", role = \"controller\", journal = \"" + c.dir +
                 "/c1-bus.journal\",\n"
                 "  plugins = { \"runner\", \"scheduler\" },\n"
                 "  job = { backend = \"slurm\", ranks = 2, standby = 1, dir = \"" +
                 job_dir +
                 "\", progress = false,\n"
                 "    command = { \"python3\", \"" +
                 kTrainer +
                 "\", \"--steps\", \"100000\", \"--step-seconds\", \"0.1\", \"--checkpoint-every\", \"5\" },\n"
                 "    placement_timeout_seconds = 5,\n"
                 "    slurm = { conf = \"" +
                 c.conf +
                 "\", nodes = { \"n1\", \"n2\" }, spares = { \"n4\" }, reservation = \"ballast-spares\" } },\n"
                 "  policy = { script = \"" +
                 c.dir +
                 "/policy.lua\", fallback = \"escalate\" },\n"
                 "  cluster = { listen = \"" +
                 listen + "\", " + tls_table(certs, "controller") + ",\n    etcd = { endpoint = \"" + etcd +
                 "\", job = \"" + job_key +
                 "\", lease_s = 3 },\n"
                 "    ingest_journal = \"" +
                 c.dir + "/c1-ingest.journal\", durable = false, heartbeat_ms = 250, silent_after_ms = 1500 } }\n");
  auto agent = [&](const std::string& node) { return start_agent(c.dir, certs, listen, node, 1500); };
  Proc c1 = spawn({kBallast, "run", c.dir + "/c1.lua", "--json"}, c.dir + "/c1.out", c.dir + "/c1.err");
  Proc a1 = agent("n1"), a2 = agent("n2");
  Slurm slurm(c.conf);
  auto connected = [&](const std::string& node) {
    return read_file(c.dir + "/c1.err").find("node " + node + " connected") != std::string::npos;
  };
  // The leader acts: it submits the job (after waiting to lead), drains n1 when n1's agent dies and
  // requeues the job onto n2 and the spare n4, each recorded in etcd first.
  const bool up = eventually(30, [&] {
    return connected("n1") && connected("n2") && !read_file(job_dir + "/checkpoints/step-00000005.safetensors").empty();
  });
  INFO("c1: " << read_file(c.dir + "/c1.err"));
  REQUIRE(up);
  CHECK(read_file(c.dir + "/c1.err").find("this controller leads: the job is started") != std::string::npos);
  a1.signal(SIGKILL);
  a1.wait();
  REQUIRE(eventually(30, [&] { return node(slurm, "n1").drained(); }));
  REQUIRE(eventually(30, [&] {
    return read_file(job_dir + "/slurm/job.out").find("ballast: run 1, restart 1, nodes n[2,4]") != std::string::npos;
  }));
  // The replace done (every rank up again): a node silent from now on is a new fault.
  REQUIRE(eventually(30, [&] { return read_file(c.dir + "/c1.err").find("replace: ok") != std::string::npos; }));
  // The runner's records: submit, drain, requeue and release, replaced by the snapshot after the
  // second launch, which names n1 drained.
  const std::string records = etcdctl(c.dir, etcd, "get --prefix /ballast/" + job_key + "/records/ --print-value-only");
  INFO("etcd: " << records);
  CHECK(records.find("\"kind\":\"slurm.snapshot\"") != std::string::npos);
  CHECK(records.find("\"drained\":[{\"node\":\"n1\",\"silent\":true}]") != std::string::npos);

  // Deposed: another candidate waits; c1's leader key goes (as when its lease lapses), so c2 leads
  // while c1 still believes it does. Then n2's agent dies: c1's policy evicts n2, and the drain's
  // record is refused by etcd's fenced transaction.
  write_file(c.dir + "/c2.lua",
             controller_config("127.0.0.1:" + std::to_string(c.port + 90), certs, c.dir + "/c2", etcd, 3));
  Proc c2 = spawn({kBallast, "run", c.dir + "/c2.lua"}, c.dir + "/c2.out", c.dir + "/c2.err");
  REQUIRE(eventually(20, [&] { return read_file(c.dir + "/c2.err").find("campaigning") != std::string::npos; }));
  const std::string first =
      etcdctl(c.dir, etcd, "get --prefix /ballast/" + job_key + "/leader --sort-by=CREATE --order=ASCEND --keys-only");
  const std::string c1_key = first.substr(0, first.find('\n'));
  REQUIRE(!c1_key.empty());
  etcdctl(c.dir, etcd, "del " + c1_key);
  REQUIRE(eventually(20, [&] { return read_file(c.dir + "/c2.err").find("is the leader") != std::string::npos; }));
  a2.signal(SIGKILL);
  a2.wait();
  std::string error;
  // c1 stands down: its job state `stopped`, and it exits.
  REQUIRE(eventually(30, [&] { return read_file(c.dir + "/c1.out").find("\"state\"") != std::string::npos; }));
  CHECK(c1.wait() == 1);
  const std::string log = read_file(c.dir + "/c1.err");
  CHECK(log.find("slurm.drain") != std::string::npos);
  CHECK(log.find("not carried out: BALLAST_EFENCED") != std::string::npos);
  // Slurm's view, a while later: n2 not drained, the job still running its second run on n[2,4]
  // (not requeued, not cancelled by the deposed controller's exit).
  std::this_thread::sleep_for(std::chrono::seconds(2));
  CHECK_FALSE(node(slurm, "n2").drained());
  std::string squeue;
  REQUIRE(slurm.run({"squeue", "-h", "-o", "%i %T %N"}, &squeue, &error));
  INFO("squeue: " << squeue);
  CHECK(squeue.find("RUNNING n[2,4]") != std::string::npos);
  const std::string out = read_file(job_dir + "/slurm/job.out");
  CHECK(out.find("run 2") == std::string::npos);
  CHECK(out.find("restart 2") == std::string::npos);
  const std::string after = etcdctl(c.dir, etcd, "get --prefix /ballast/" + job_key + "/records/ --print-value-only");
  CHECK(after.find("\"node\":\"n2\",\"reason\"") == std::string::npos);  // no drain of n2 recorded
  const auto report = nlohmann::json::parse(read_file(c.dir + "/c1.out"), nullptr, false);
  REQUIRE(report.is_object());
  CHECK(report["state"] == "stopped");
  CHECK(report["counters"].value("fence.refused", 0) >= 1);
  CHECK(report["counters"].value("runner.fenced_off", 0) >= 1);
  CHECK(report["counters"].value("fence.allowed", 0) >= 4);
  c2.signal(SIGTERM);
  c2.wait();
  // The job left running for a leader that never came: cancelled, so that its ranks do not outlive the case.
  CHECK(slurm.run({"scancel", "--name=job"}, nullptr, &error));
  CHECK(eventually(30, [&] {
    std::string left;
    return slurm.run({"squeue", "-h", "--name=job"}, &left, &error) && left.empty();
  }));
}

TEST_CASE(
    "takeover against Slurm's state: re-attach only to the run Slurm runs as the records say, with no action in "
    "flight; else a restart, naming why") {
  Cluster c;
  REQUIRE_MESSAGE(c.up, "slurm-up failed: " << read_file(c.dir + "/log/slurmctld.log"));
  Slurm slurm(c.conf);
  std::string error;
  const std::string name = "ra" + std::to_string(getpid()), dir = c.dir + "/job-ra";
  long id = 0;
  REQUIRE_MESSAGE(
      slurm.submit({"-J", name, "--requeue", "-N2", "--nodelist=n1,n2", "-o", "/dev/null", "--wrap", "sleep 300"}, &id,
                   &error),
      error);
  REQUIRE(eventually(20, [&] {
    JobInfo info;
    return slurm.job(id, &info, &error) && info.state == "RUNNING";
  }));
  ballast::runner::SlurmConfig cfg;
  cfg.conf = c.conf;
  cfg.nodes = {"n1", "n2"};
  cfg.spares = {"n4"};
  const nlohmann::json attempt = {
      {"number", 3}, {"wall_ns", 1}, {"master_port", 29500}, {"from_step", 10}, {"checkpoint", ""}};
  const nlohmann::json snapshot = {{"job", name},
                                   {"slurm_job", id},
                                   {"run", 0},
                                   {"slots", {"n1", "n2", "n4"}},
                                   {"nodes", {"n2", "n1"}},
                                   {"drained", nlohmann::json::array()},
                                   {"attempt", attempt}};
  auto entry = [](const std::string& kind, const nlohmann::json& record) {
    return nlohmann::json{{"kind", kind}, {"record", record}};
  };
  // The backend of a successor, whose requeue is refused: the job stays as it runs for the next case.
  auto take = [&](const nlohmann::json& log, const std::string& current, ballast::runner::TakeOver* t) {
    ballast::runner::SlurmBackend b(cfg, name, 2);
    b.set_fence([](const std::string& kind, const nlohmann::json&, std::string* why) {
      *why = "refused by the test";
      return kind == "slurm.requeue" ? BALLAST_EFENCED : BALLAST_OK;
    });
    REQUIRE_MESSAGE(b.prepare(3, dir, &error), error);
    write_file(dir + "/slurm/current", current + "\n");
    error.clear();
    const bool ok = b.take_over(log, t, &error);
    if (ok && t->attempt.is_object()) CHECK_MESSAGE(b.reattach({{0, 1}, {1, 0}}, &error), error);
    return ok;
  };
  ballast::runner::TakeOver t;
  // As recorded (the nodes in any order): re-attached, nothing requeued.
  REQUIRE_MESSAGE(take(nlohmann::json::array({entry("slurm.snapshot", snapshot)}), "0", &t), error);
  CHECK(t.outcome == ballast::runner::TakeOver::adopted);
  CHECK(t.attempt == attempt);
  CHECK(t.restart.empty());
  const nlohmann::json stop = {{"job", name}, {"slurm_job", id}, {"node", "n1"}, {"rank", 0}, {"signal", SIGSTOP}};
  nlohmann::json cont = stop;
  cont["signal"] = SIGCONT;
  REQUIRE(take(nlohmann::json::array(
                   {entry("slurm.snapshot", snapshot), entry("slurm.signal", stop), entry("slurm.signal", cont)}),
               "0", &t));
  CHECK(t.restart.empty());
  // A signal record of another writer's form (text, not numbers) stops no rank.
  REQUIRE(take(nlohmann::json::array({entry("slurm.snapshot", snapshot),
                                      entry("slurm.signal", {{"job", name}, {"rank", "0"}, {"signal", "STOP"}})}),
               "0", &t));
  CHECK(t.restart.empty());
  // Otherwise a restart: its requeue asked (refused here), the reason kept.
  const auto restarted = [&](const nlohmann::json& log, const std::string& current, const std::string& why) {
    CHECK_FALSE(take(log, current, &t));
    CHECK(error.find("slurm.requeue not carried out") != std::string::npos);
    CHECK_MESSAGE(t.restart.find(why) != std::string::npos, t.restart);
    CHECK(t.attempt.is_null());
  };
  nlohmann::json older = snapshot;
  older.erase("attempt");
  restarted(nlohmann::json::array({entry("slurm.snapshot", older)}), "0", "has no attempt");
  restarted(nlohmann::json::array({entry("slurm.snapshot", snapshot),
                                   entry("slurm.drain", {{"job", name}, {"node", "n4"}, {"cause", "node.silent"}})}),
            "0", "in flight at the earlier leader: slurm.drain");
  restarted(nlohmann::json::array(
                {entry("slurm.snapshot", snapshot), entry("slurm.requeue", {{"job", name}, {"slurm_job", id}})}),
            "0", "in flight at the earlier leader: slurm.requeue");
  nlohmann::json drained = snapshot;
  drained["drained"] = {{{"node", "n2"}, {"silent", true}}};
  restarted(nlohmann::json::array({entry("slurm.snapshot", drained)}), "0", "node n2 is drained");
  restarted(nlohmann::json::array({entry("slurm.snapshot", snapshot), entry("slurm.signal", stop)}), "0",
            "ranks stopped");
  nlohmann::json stopped = snapshot;
  stopped["stopped"] = {1};
  restarted(nlohmann::json::array({entry("slurm.snapshot", stopped)}), "0", "ranks stopped");
  nlohmann::json elsewhere = snapshot;
  elsewhere["nodes"] = {"n1", "n4"};
  restarted(nlohmann::json::array({entry("slurm.snapshot", elsewhere)}), "0", "the records on n1,n4");
  restarted(nlohmann::json::array({entry("slurm.snapshot", snapshot)}), "1", "is not the records' run 0");
  // Slurm's job as it was: running, never requeued.
  JobInfo info;
  REQUIRE(slurm.job(id, &info, &error));
  CHECK(info.state == "RUNNING");
  CHECK(info.restarts == 0);
  CHECK(slurm.run({"scancel", std::to_string(id)}, nullptr, &error));
}

namespace {

// A controller candidate running the job on Slurm (c1, c2: the same job table, as a deployment's).
std::string candidate_config(const std::string& name, const std::string& dir, const std::string& listen,
                             const std::string& certs, const std::string& etcd, const std::string& job_key,
                             const std::string& conf) {
  return "return { node = \"" + name + "\", role = \"controller\", journal = \"" + dir + "/" + name +
         "-bus.journal\",\n"
         "  plugins = { \"runner\", \"scheduler\" },\n"
         "  job = { name = \"tk" +
         std::to_string(getpid()) + "\", backend = \"slurm\", ranks = 2, standby = 1, dir = \"" + dir +
         "/job-tk\", progress = false,\n"
         "    command = { \"python3\", \"" +
         kTrainer +
         "\", \"--steps\", \"240\", \"--step-seconds\", \"0.1\", \"--checkpoint-every\", \"5\" },\n"
         "    placement_timeout_seconds = 5,\n"
         "    slurm = { conf = \"" +
         conf +
         "\", nodes = { \"n1\", \"n2\" }, spares = { \"n4\" }, reservation = \"ballast-spares\" } },\n"
         "  policy = { script = \"" +
         dir +
         "/policy.lua\", fallback = \"escalate\" },\n"
         "  cluster = { listen = \"" +
         listen + "\", " + tls_table(certs, "controller") + ",\n    etcd = { endpoint = \"" + etcd + "\", job = \"" +
         job_key + "\", lease_s = 3 },\n    ingest_journal = \"" + dir + "/" + name +
         "-ingest.journal\", durable = false, heartbeat_ms = 250, silent_after_ms = 1500 } }\n";
}

// Every JSON payload of `topic` in a bus journal, in order.
std::vector<nlohmann::json> json_events(const std::string& journal, const std::string& topic) {
  std::vector<nlohmann::json> out;
  ballast::read_journal(
      journal, ballast::JournalMode::skip_bad,
      [&](const ballast::OwnedEvent& ev, uint64_t) {
        const ballast_event& e = ev.view();
        if (e.schema == BALLAST_SCHEMA_JSON && topic == e.topic && e.payload)
          out.push_back(nlohmann::json::parse(static_cast<const char*>(e.payload),
                                              static_cast<const char*>(e.payload) + e.payload_size, nullptr, false));
      },
      [](const ballast::JournalProblem&) {});
  return out;
}

}  // namespace

TEST_CASE(
    "with etcd, kill -9 the leader: its successor takes over the Slurm job (the same job); Slurm not running it, it "
    "restarts from a checkpoint without the drained node, resumed when its agent is back; Slurm running it, the next "
    "successor re-attaches to the running ranks (no requeue, the same processes, each step once); the last one's "
    "report covers the whole job (its start, attempts, incidents and kept seconds carried in the snapshots)") {
  Cluster c;
  REQUIRE_MESSAGE(c.up, "slurm-up failed: " << read_file(c.dir + "/log/slurmctld.log"));
  const ClusterEtcd etcd_server(c);
  REQUIRE_MESSAGE(etcd_server.up, "etcd did not start: " << read_file(etcd_server.dir + "/stdout.log"));
  const std::string& etcd = etcd_server.endpoint;
  const std::string certs = c.dir + "/certs";
  REQUIRE(sh(engines() + "/make-certs " + certs + " 127.0.0.1 -- n1 n2") == 0);
  const std::string l1 = "127.0.0.1:" + std::to_string(test::reserve_ports(1)),
                    l2 = "127.0.0.1:" + std::to_string(test::reserve_ports(1));
  REQUIRE(l1 != l2);
  const std::string job_key = "tk" + std::to_string(getpid()), job_dir = c.dir + "/job-tk";
  write_file(c.dir + "/policy.lua",
             "ballast.on(\"node.silent\", function(ev)\n"
             "  local node = (ev.payload or {}).subject or ev.source.node\n"
             "  return {action = \"evict\", subject = node, reason = \"node.silent \" .. tostring(node)}\n"
             "end)\n");
  for (const char* name : {"c1", "c2"})
    write_file(c.dir + "/" + name + ".lua",
               candidate_config(name, c.dir, name == std::string("c1") ? l1 : l2, certs, etcd, job_key, c.conf));
  // c1's injection (rank 0 slowed a little from step 2) is an incident its successors' reports carry.
  const auto unix_s = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  const double before_c1 = unix_s();
  Proc c1 = spawn({kBallast, "run", c.dir + "/c1.lua", "--json", "--inject", "slow:rank=0,factor=1.2@step2"},
                  c.dir + "/c1.out", c.dir + "/c1.err");
  REQUIRE(eventually(20, [&] { return read_file(c.dir + "/c1.err").find("is the leader") != std::string::npos; }));
  // The second candidate, with the same job table, waits; its executor leaves the leader's job channel alone.
  const double before_c2 = unix_s();
  Proc c2 = spawn({kBallast, "run", c.dir + "/c2.lua", "--json"}, c.dir + "/c2.out", c.dir + "/c2.err");
  auto agent = [&](const std::string& node) { return start_agent(c.dir, certs, l1 + "," + l2, node, 1500); };
  Proc a1 = agent("n1"), a2 = agent("n2");
  Slurm slurm(c.conf);
  std::string error;
  INFO("c1: " << read_file(c.dir + "/c1.err"));
  INFO("c2: " << read_file(c.dir + "/c2.err"));
  REQUIRE(eventually(30, [&] { return !read_file(job_dir + "/checkpoints/step-00000005.safetensors").empty(); }));
  std::vector<JobInfo> jobs;
  REQUIRE_MESSAGE(slurm.jobs_named(job_key, &jobs, &error), error);
  REQUIRE(jobs.size() == 1);
  const long id = jobs[0].id;

  // The node fault under c1: n1 drained, the job requeued onto n2 and the spare n4.
  a1.signal(SIGKILL);
  a1.wait();
  REQUIRE(eventually(30, [&] { return node(slurm, "n1").drained(); }));
  REQUIRE(eventually(30, [&] { return read_file(c.dir + "/c1.err").find("replace: ok") != std::string::npos; }));
  REQUIRE(read_file(job_dir + "/slurm/job.out").find("ballast: run 1, restart 1, nodes n[2,4]") != std::string::npos);

  // Two malformed records in the log (as another writer might leave): the successor names and skips them.
  const std::string actions = "/ballast/" + job_key + "/actions/";
  etcdctl(c.dir, etcd, "put " + actions + "00000000000000000001 'not json'");
  etcdctl(c.dir, etcd,
          "put " + actions +
              "00000000000000000002 '{\"node\":\"c0\",\"plugin\":\"runner\",\"kind\":\"slurm.drain\",\"record\":[],"
              "\"term\":1}'");

  // The leader stops, Slurm requeues the job meanwhile (as a person or Slurm itself might), and the
  // leader dies: its snapshot says run 1 runs, Slurm says it does not, and c2, leading after the
  // lease (3 s), restarts the job from its checkpoint. n1's agent comes back meanwhile, knowing
  // only c2: its first connection is to the new leader (refused until c2 leads), so n1 is heard by
  // c2 through node.connected, never node.silent/node.back.
  c1.signal(SIGSTOP);
  REQUIRE_MESSAGE(slurm.run({"scontrol", "requeue", std::to_string(id)}, nullptr, &error), error);
  c1.signal(SIGKILL);
  c1.wait();
  const double c1_killed = unix_s();
  CHECK(node(slurm, "n1").drained());
  a1 = start_agent(c.dir, certs, l2, "n1", 1500);
  REQUIRE(eventually(20, [&] {
    return read_file(c.dir + "/c2.err")
               .find("took over the job an earlier leader ran: Slurm job " + std::to_string(id)) != std::string::npos;
  }));
  REQUIRE(eventually(30, [&] {
    return read_file(job_dir + "/slurm/job.out").find("ballast: run 2, restart 2, nodes n[2,4]") != std::string::npos;
  }));
  const std::string log_c2 = read_file(c.dir + "/c2.err");
  CHECK(log_c2.find("the adopted job is restarted from its checkpoint: Slurm has the job PENDING, not RUNNING") !=
        std::string::npos);
  CHECK(log_c2.find("re-attached") == std::string::npos);
  // c1's report figures, carried on: its attempts 0 and 1, its incident.
  CHECK(log_c2.find("carried over the job's report: 2 attempt(s), 1 incident(s)") != std::string::npos);
  CHECK(log_c2.find("action log: " + actions + "00000000000000000001 is skipped: not a JSON object") !=
        std::string::npos);
  CHECK(log_c2.find("action log: " + actions +
                    "00000000000000000002 is skipped: field 'record' is missing or not an object") !=
        std::string::npos);
  CHECK(log_c2.find("skipped 2 malformed record(s)") != std::string::npos);
  // Slurm has the one job of that name, the same one.
  REQUIRE(slurm.jobs_named(job_key, &jobs, &error));
  CHECK(jobs.size() == 1);
  CHECK(jobs[0].id == id);

  // n1, drained by c1, is resumed by c2 on its agent's first node.connected (c2 logs it once
  // scontrol has answered, which may be after Slurm shows it).
  CHECK(eventually(30, [&] { return !node(slurm, "n1").drained(); }));
  CHECK(eventually(
      10, [&] { return read_file(c.dir + "/c2.err").find("n1 is repaired: a standby again") != std::string::npos; }));

  // c2 started the job from a checkpoint, not step 0.
  const std::string log2 = read_file(c.dir + "/c2.err");
  const size_t from = log2.find("this controller leads: the job is started from ");
  REQUIRE(from != std::string::npos);
  const size_t step_at = log2.find("step-", from);
  REQUIRE(step_at != std::string::npos);
  const int restart_step = std::atoi(log2.c_str() + step_at + 5);
  CHECK(restart_step >= 5);

  // c2's attempt (its first, the job's third: attempt 2) trains, ten steps past its checkpoint; then c2 dies. Slurm
  // runs the job as c2's snapshot says, and c3 (on c2's address, which the agents know)
  // re-attaches to its ranks.
  char next[64];
  std::snprintf(next, sizeof next, "/checkpoints/step-%08d.safetensors", restart_step + 10);
  REQUIRE(eventually(30, [&] { return !read_file(job_dir + next).empty(); }));
  CHECK(eventually(10, [&] {
    for (const auto& j : json_events(c.dir + "/c2-bus.journal", "job.state"))
      if (j["state"] == "running") return true;
    return false;
  }));
  const std::string pid0 = read_file(job_dir + "/slurm/run-2/pid-0"), pid1 = read_file(job_dir + "/slurm/run-2/pid-1");
  REQUIRE(std::atoi(pid0.c_str()) > 0);
  REQUIRE(std::atoi(pid1.c_str()) > 0);
  REQUIRE(slurm.jobs_named(job_key, &jobs, &error));
  REQUIRE(jobs.size() == 1);
  const int restarts = jobs[0].restarts;
  c2.signal(SIGKILL);
  c2.wait();
  write_file(c.dir + "/c3.lua", candidate_config("c3", c.dir, l2, certs, etcd, job_key, c.conf));
  // Its injection (rank 0 slowed twofold from step 200) goes through the control file, kept for the ranks.
  Proc c3 = spawn({kBallast, "run", c.dir + "/c3.lua", "--json", "--timeline", c.dir + "/c3-timeline.json", "--inject",
                   "slow:rank=0,factor=2@step200"},
                  c.dir + "/c3.out", c.dir + "/c3.err");
  INFO("c3: " << read_file(c.dir + "/c3.err"));
  REQUIRE(eventually(20, [&] {
    return read_file(c.dir + "/c3.err").find("this controller leads: re-attached to the running attempt 2") !=
           std::string::npos;
  }));
  // The same run of the same Slurm job (not requeued), the same rank processes, still alive.
  REQUIRE(slurm.jobs_named(job_key, &jobs, &error));
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].id == id);
  CHECK(jobs[0].restarts == restarts);
  CHECK(read_file(job_dir + "/slurm/run-2/pid-0") == pid0);
  CHECK(read_file(job_dir + "/slurm/run-2/pid-1") == pid1);
  CHECK(kill(std::atoi(pid0.c_str()), 0) == 0);
  CHECK(kill(std::atoi(pid1.c_str()), 0) == 0);

  // The job ends under c3, in c2's attempt 2 carried on, trained to the end.
  const auto report = finished_job(job_dir, c.dir + "/c3.out", c3, {&a1, &a2});
  INFO("report: " << report.dump());
  CHECK(report["state"] == "finished");
  // The report covers the whole job: c1's start (c2 and c3 started later), c1's two attempts
  // and c2's, c1's incident before c3's own (its injection at step 200).
  CHECK(report["earlier_leaders"] == true);
  CHECK(report["start_unix_s"].get<double>() >= before_c1 - 0.01);
  CHECK(report["start_unix_s"].get<double>() <= before_c2 + 0.01);
  CHECK(report["attempts"] == 3);
  REQUIRE(report["incidents"].size() == 2);
  CHECK(report["incidents"][0]["id"] == 1);
  CHECK(report["incidents"][0]["fault"] == "slow:rank=0,factor=1.2@step2");
  CHECK(report["incidents"][0]["injected_s"].get<double>() > 0);
  CHECK(report["incidents"][0]["injected_s"].get<double>() < c1_killed - report["start_unix_s"].get<double>());
  CHECK(report["incidents"][1]["fault"] == "slow:rank=0,factor=2@step200");
  CHECK(report["incidents_omitted"] == 0);
  const std::string log3 = read_file(c.dir + "/c3.err");
  CHECK(log3.find("the job is started") == std::string::npos);
  CHECK(log3.find("restarted from its checkpoint") == std::string::npos);
  const std::string out = read_file(job_dir + "/slurm/job.out");
  INFO(out);
  CHECK(out.find("run 3") == std::string::npos);
  CHECK(out.find("restart " + std::to_string(restarts + 1)) == std::string::npos);
  // c3 applied rank 0's steps of attempt 0 once each, in order, from past c2's checkpoint to the end.
  const auto timeline = nlohmann::json::parse(read_file(c.dir + "/c3-timeline.json"), nullptr, false);
  REQUIRE(timeline.contains("traceEvents"));
  std::vector<int> steps;
  for (const auto& e : timeline["traceEvents"])
    if (e.value("tid", 0) == 2 && e.value("name", "").rfind("step ", 0) == 0) {
      steps.push_back(std::atoi(e["name"].get<std::string>().c_str() + 5));
      CHECK(e["args"]["attempt"] == 2);
      // The rank read c3's command: its steps after it take twice the 0.1 s.
      if (steps.back() >= 205) CHECK(e.value("dur", 0.0) >= 190000);
    }
  REQUIRE(!steps.empty());
  CHECK(steps.front() > restart_step + 10);
  CHECK(steps.back() == 240);
  // The ETTR's kept seconds are the whole lineage's: c1's steps up to its last checkpoint
  // (five or more of at least 0.1 s) before c3's own.
  double own_s = 0;
  for (const auto& e : timeline["traceEvents"])
    if (e.value("tid", 0) == 2 && e.value("name", "").rfind("step ", 0) == 0) own_s += e.value("dur", 0.0) / 1e6;
  CHECK(report["kept_step_s"].get<double>() > own_s + 0.4);
  CHECK(report["ettr"].get<double>() ==
        doctest::Approx(report["kept_step_s"].get<double>() / report["wall_s"].get<double>()).epsilon(0.01));
  CHECK(std::adjacent_find(steps.begin(), steps.end(), [](int a, int b) { return b <= a; }) == steps.end());
  const auto weights = nlohmann::json::parse(read_file(job_dir + "/final-weights.json"), nullptr, false);
  double w = 1.0;
  for (int n = 1; n <= 240; ++n) w = std::fmod(w * 1.0001 + n * 1e-3, 1000.0);
  CHECK(weights["step"] == 240);
  CHECK(std::abs(weights["w"].get<double>() - w) < 1e-9);

  // c2 heard n1 once, by node.connected (never silent, never back), and resumed it once.
  const std::string bus2 = c.dir + "/c2-bus.journal";
  CHECK(bus_count(bus2, "node.connected", "n1") == 1);
  CHECK(bus_count(bus2, "node.silent", "n1") == 0);
  CHECK(bus_count(bus2, "node.back", "n1") == 0);
  size_t repaired = 0;
  for (size_t at = log2.find("n1 is repaired: a standby again"); at != std::string::npos;
       at = log2.find("n1 is repaired: a standby again", at + 1))
    ++repaired;
  CHECK(repaired == 1);
  CHECK(log2.find("drained and not resumed: n1") != std::string::npos);

  // What c2 took over from: c1's snapshot (after its second launch: submit, drain, requeue and
  // release replaced by it), nothing older, and the records after it (none).
  const auto leader = nlohmann::json::parse(last_json(bus2, "controller.leader"), nullptr, false);
  REQUIRE(leader.is_object());
  INFO("controller.leader: " << leader.dump());
  std::vector<nlohmann::json> handed;
  for (const auto& r : leader["log"])
    if (r.value("plugin", "") == "runner") handed.push_back(r);
  REQUIRE(handed.size() == 1);
  CHECK(handed[0]["kind"] == "slurm.snapshot");
  CHECK(handed[0]["record"]["run"] == 1);
  auto nodes = handed[0]["record"]["nodes"].get<std::vector<std::string>>();  // in rank order: n4 took n1's place
  std::sort(nodes.begin(), nodes.end());
  CHECK(nodes == std::vector<std::string>{"n2", "n4"});
  CHECK(handed[0]["record"]["drained"] == nlohmann::json::parse(R"([{"node":"n1","silent":true}])"));
  CHECK(handed[0]["record"]["attempt"]["number"] == 1);
  // What c3 re-attached from: c2's snapshot of its attempt 0, run 2.
  const auto leader3 = nlohmann::json::parse(last_json(c.dir + "/c3-bus.journal", "controller.leader"), nullptr, false);
  REQUIRE(leader3.is_object());
  nlohmann::json last_launch;
  for (const auto& r : leader3["log"])
    if (r.value("plugin", "") == "runner" && r.value("kind", "") == "slurm.snapshot") last_launch = r["record"];
  REQUIRE(last_launch.is_object());
  CHECK(last_launch["run"] == 2);
  CHECK(last_launch["attempt"]["number"] == 2);
  CHECK(last_launch["report"]["attempts"] == 3);
  CHECK(last_launch["report"]["incidents"].size() == 1);

  // etcd's action log at the end: c3's newest snapshot (the first at its re-attach) and the records
  // after it, nothing of the earlier terms (replaced by it); the job's end (slurm.cancel) last.
  std::vector<nlohmann::json> left;
  std::istringstream records(etcdctl(c.dir, etcd, "get --prefix /ballast/" + job_key + "/records/ --print-value-only"));
  for (std::string line; std::getline(records, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("kind")) left.push_back(j);
  }
  INFO("records: " << nlohmann::json(left).dump());
  REQUIRE(!left.empty());
  CHECK(left.front()["kind"] == "slurm.snapshot");
  CHECK(left.back()["kind"] == "slurm.cancel");
  CHECK(left.size() <= 1 + 16);  // a snapshot and at most SlurmBackend::kSnapshotEvery records
  for (const auto& r : left) CHECK(r["term"] == left.front()["term"]);
  CHECK(left.front()["term"].get<uint64_t>() > handed[0]["term"].get<uint64_t>());
  CHECK(std::count_if(left.begin(), left.end(), [](const nlohmann::json& r) { return r["kind"] == "slurm.submit"; }) ==
        0);
}

// A controller candidate's host, in process: its fence refuses everything until the candidate
// leads (controller.leader, published here with an empty log), then every slurm.snapshot, as a
// controller refuses one over its bound. The snapshot after the launch that ends the wait to lead
// is shown (the job, the reason, the earlier records kept) and counted, and the job runs on; so
// are those written every snapshot_seconds while it trains.
TEST_CASE("a slurm.snapshot refused by the fence is logged and counted; the job runs on") {
  Cluster c;
  REQUIRE_MESSAGE(c.up, "slurm-up failed: " << read_file(c.dir + "/log/slurmctld.log"));
  const std::string job_dir = c.dir + "/job";
  nlohmann::json config;
  REQUIRE(ballast::eval_lua_table("return { node = \"ctl\", plugins = { { path = \"runner\", config = {\n"
                                  "  job = { name = \"snap\", backend = \"slurm\", ranks = 2, standby = 0, dir = \"" +
                                      job_dir +
                                      "\", progress = false,\n"
                                      "    command = { \"python3\", \"" +
                                      kTrainer +
                                      "\", \"--steps\", \"100000\", \"--step-seconds\", \"0.1\", "
                                      "\"--checkpoint-every\", \"5\" },\n"
                                      "    slurm = { conf = \"" +
                                      c.conf + "\", nodes = { \"n1\", \"n2\" }, snapshot_seconds = 1 } } } } } }",
                                  true, &config) == BALLAST_OK);
  std::unique_ptr<ballast::Host> host;
  REQUIRE_MESSAGE(ballast::host_from_config(config, c.dir, &host) == BALLAST_OK, ballast::last_error());
  std::vector<std::string> kinds;
  std::mutex kinds_mutex;
  std::atomic<bool> leading{false};
  host->set_action_fence([&](const std::string&, const std::string& kind, const nlohmann::json&) {
    std::lock_guard lock(kinds_mutex);
    kinds.push_back(kind);
    if (!leading) return ballast::fail(BALLAST_EFENCED, "ctl is not the leader");
    return kind.ends_with(".snapshot") ? ballast::fail(BALLAST_EINVAL, "a record of 2000000 bytes, more than 1048576")
                                       : BALLAST_OK;
  });
  // The host logs to stderr: kept in a file while it runs.
  const std::string log_path = c.dir + "/host.err";
  const int saved = dup(2), log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(log_fd >= 0);
  dup2(log_fd, 2);
  const bool started = host->start() == BALLAST_OK;
  leading = true;
  const bool term = started && host->publish_json("controller.leader", R"({"log":[]})", "test") == BALLAST_OK;
  const bool trained =
      term && eventually(60, [&] { return !read_file(job_dir + "/checkpoints/step-00000010.safetensors").empty(); });
  // The launch's snapshot, then one a second while the job trains.
  const bool periodic = trained && eventually(10, [&] { return host->counter("runner.snapshots_refused") >= 3; });
  const int64_t fenced = host->counter("runner.fenced_off");
  host->stop();
  host.reset();
  dup2(saved, 2);
  close(saved);
  close(log_fd);
  const std::string log = read_file(log_path);
  INFO("host: " << log);
  REQUIRE(started);
  REQUIRE(term);
  CHECK(log.find("this controller leads: the job is started") != std::string::npos);
  CHECK(trained);  // the refusal after the launch does not stop the job
  CHECK(periodic);
  CHECK(fenced == 0);  // not a fence's refusal of an operation
  CHECK(std::count(kinds.begin(), kinds.end(), "slurm.submit") == 1);
  CHECK(std::count(kinds.begin(), kinds.end(), "slurm.snapshot") >= 3);
  CHECK(log.find("job snap: slurm.snapshot of ") != std::string::npos);
  CHECK(log.find("not recorded (BALLAST_EINVAL: a record of 2000000 bytes, more than 1048576); the action log "
                 "keeps the job's earlier records") != std::string::npos);
  std::string error;
  Slurm slurm(c.conf);
  CHECK(slurm.run({"scancel", "--name=snap"}, nullptr, &error));
}
