// The Slurm side of recovery against a real 4-node Slurm (tools/engines/
// slurm-up: munged, slurmctld and four slurmd on ports of their own): a
// trainer that checkpoints each step runs on two nodes; a node fault (here
// the test stands in for Ballast's heartbeat detector) ends with the node
// drained under a reason naming the fault, the job requeued without it and
// training resumed from its checkpoint; then a warm spare held in a
// reservation replaces a second faulty node through --nodelist; then the
// repaired nodes are resumed.
#include "cluster_harness.hpp"
#include "slurm.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>

using namespace cluster_test;
using ballast::slurm::JobInfo;
using ballast::slurm::NodeInfo;
using ballast::slurm::Slurm;

namespace {

struct Cluster {
  std::string dir, conf;
  bool up = false;
  Cluster() {
    dir = scratch_dir("slurm");
    int port = 30000 + static_cast<int>(getpid() % 300) * 110;
    int rc = sh("SLURM_TEST_PORT=" + std::to_string(port) + " " + engines() + "/slurm-up " + dir + " 4 >/dev/null");
    up = rc == 0;
    conf = dir + "/slurm.conf";
  }
  ~Cluster() { sh(engines() + "/slurm-down " + dir); }
};

std::string trainer_script(const std::string& dir) {
  return "#!/bin/bash\n"
         "ck=" + dir + "/ckpt; step=0; [ -f $ck ] && step=$(cat $ck)\n"
         "echo \"start restart=${SLURM_RESTART_COUNT:-0} nodes=$SLURM_JOB_NODELIST from_step=$step\"\n"
         "while [ $step -lt 40 ]; do sleep 0.1; step=$((step+1)); echo $step > $ck.tmp && mv $ck.tmp $ck; done\n"
         "echo \"done step=$step\"\n";
}

int checkpoint(const std::string& dir) {
  std::string s = read_file(dir + "/ckpt");
  return s.empty() ? 0 : std::atoi(s.c_str());
}

JobInfo wait_job(Slurm& slurm, long id, const std::string& state, double timeout_s) {
  JobInfo info;
  std::string error;
  eventually(timeout_s, [&] { return slurm.job(id, &info, &error) && info.state == state; });
  return info;
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
  REQUIRE_MESSAGE(slurm.submit({"-N2", "--requeue", "--open-mode=append", "-o", c.dir + "/job.out", c.dir + "/train.sh"},
                               &job, &error),
                  error);
  JobInfo info = wait_job(slurm, job, "RUNNING", 15);
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
