"""examples/pytorch (DDP on the CPU with gloo) under the real `ballast
launch`, with faults injected: the launcher names the rank that hangs,
crashes or is stopped from the ranks' heartbeats and process states, within
the stall threshold + 1 s of the fault (on the launcher's and the ranks' own
clocks), `ballast analyze` of the folder agrees with it afterwards, and a
crashed job resumes from its last checkpoint. Skipped without python3-torch."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HAVE_TORCH = subprocess.run(["/usr/bin/python3", "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                            capture_output=True).returncode == 0
SOURCE = os.environ.get("BALLAST_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BALLAST = os.environ.get("BALLAST_EXE", "ballast")
TRAIN = os.path.join(SOURCE, "examples", "pytorch", "train.py")
STALL = 3.0


def heartbeats(folder):
    """The newest heartbeat of each rank (a folder reused by a restart holds older ones)."""
    out = {}
    for name in os.listdir(folder):
        if name.endswith(".heartbeat"):
            with open(os.path.join(folder, name)) as f:
                fields = dict(kv.split("=", 1) for kv in f.read().split())
            rank = int(fields["rank"])
            if rank not in out or int(fields["wall_ns"]) > int(out[rank]["wall_ns"]):
                out[rank] = fields
    return out


def fault_wall(output, kind):
    """The wall time the trainer printed when it injected the fault."""
    for line in output.splitlines():
        if f"injected {kind}" in line:
            return float(line.rsplit("wall ", 1)[1])
    raise AssertionError(f"no 'injected {kind}' line in:\n{output}")


@unittest.skipUnless(HAVE_TORCH, "python3-torch (with gloo) is not installed: tools/install-deps installs it")
class PyTorchLaunchTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="pytorch-launch-")
        self.traces = os.path.join(self.dir, "traces")
        self.ckpt = os.path.join(self.dir, "ckpt")

    def launch(self, *train_args, n=3, wait=True):
        cmd = [BALLAST, "launch", "-n", str(n), "--stall", str(STALL), "--trace-dir", self.traces, "--",
               "/usr/bin/python3", TRAIN, "--checkpoint-dir", self.ckpt, *train_args]
        # The ranks share one pipe: unbuffered (PYTHONUNBUFFERED), print writes
        # a line and its newline apart and two ranks' lines run together.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        if not wait:
            return p
        out, _ = p.communicate(timeout=200)
        return p.returncode, out

    def record(self):
        with open(os.path.join(self.traces, "launch.json")) as f:
            return json.load(f)

    def analyze(self):
        r = subprocess.run([BALLAST, "analyze", self.traces, "--json"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        return json.loads(r.stdout)

    def test_hang_names_the_rank_outside_the_collective(self):
        rc, out = self.launch("--steps", "400", "--hang", "2@25")
        self.assertEqual(rc, 1, out)
        self.assertIn("the job hangs: no heartbeat", out)
        rec = self.record()
        causes = rec["verdict"]["root_cause"]
        self.assertEqual([(c["rank"], c["kind"]) for c in causes], [(2, "not_joined")], out)
        self.assertIn("sleeping", causes[0]["evidence"])
        self.assertIn("separate-grads-all-reduce", causes[0]["evidence"])
        # Every live rank's Python stack: rank 2 where it sleeps, the others in backward's all-reduce.
        self.assertIn("rank 2's Python stacks:", out)
        self.assertIn("in backward", out)
        latency = rec["verdict_ns"] / 1e9 - fault_wall(out, "hang")
        print(f"hang named {latency:.2f} s after it began (stall threshold {STALL} s)")
        self.assertLess(latency, STALL + 1.0, out)
        again = self.analyze()
        self.assertEqual([(c["rank"], c["kind"]) for c in again["root_cause"]], [(2, "not_joined")])
        self.assertEqual(again["launch"]["stopped_ranks"], [0, 1, 2])

    def test_crash_is_named_and_the_job_resumes_from_its_last_checkpoint(self):
        rc, out = self.launch("--steps", "400", "--crash", "1@25", "--checkpoint-every", "10")
        self.assertEqual(rc, 1, out)
        self.assertIn("rank 1 (pid", out)
        self.assertIn("was killed by signal 9", out)
        rec = self.record()
        self.assertEqual(rec["failed_rank"], 1)
        self.assertEqual([(c["rank"], c["kind"]) for c in rec["verdict"]["root_cause"]], [(1, "crashed")], out)
        latency = rec["verdict_ns"] / 1e9 - fault_wall(out, "crash")
        print(f"crash named {latency:.2f} s after it")
        self.assertLess(latency, STALL + 1.0, out)
        self.assertEqual([(c["rank"], c["kind"]) for c in self.analyze()["root_cause"]], [(1, "crashed")])
        self.assertEqual(sorted(os.listdir(self.ckpt)), ["step-00000010.safetensors", "step-00000020.safetensors"])
        # Resumed: from step 21, to the end, the loss still falling.
        rc, out = self.launch("--steps", "60", "--resume", "latest")
        self.assertEqual(rc, 0, out)
        self.assertIn("resumed from " + os.path.join(self.ckpt, "step-00000020.safetensors") + " at step 21", out)
        for rank in range(3):
            done = [line for line in out.splitlines() if line.startswith(f"rank {rank}: done at step 60")]
            self.assertEqual(len(done), 1, out)
            first, last = (float(x) for x in done[0].split("loss ")[1].split(" -> "))
            self.assertLess(last, first, done[0])
        self.assertTrue(all(h["state"] == "done" for h in heartbeats(self.traces).values()))

    def test_stopped_rank_is_stuck_for_launch_and_for_analyze_afterwards(self):
        p = self.launch("--steps", "100000", wait=False)
        try:
            deadline = time.monotonic() + 120
            pid = None
            while time.monotonic() < deadline and pid is None:
                time.sleep(0.2)
                if os.path.isdir(self.traces):
                    beats = heartbeats(self.traces)
                    if 2 in beats and int(beats[2]["step"]) >= 10:
                        pid = int(beats[2]["pid"])
            self.assertIsNotNone(pid, "rank 2 never reached step 10")
            os.kill(pid, signal.SIGSTOP)
            stopped_at = time.time()
            out, _ = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(p.returncode, 1, out)
        rec = self.record()
        self.assertEqual([(c["rank"], c["kind"]) for c in rec["verdict"]["root_cause"]], [(2, "stuck")], out)
        self.assertLess(rec["verdict_ns"] / 1e9 - stopped_at, STALL + 1.0, out)
        self.assertIn("no stack: the process is stopped", out)
        # The launcher killed every rank since; the post-mortem still says rank 2 was stuck.
        again = self.analyze()
        self.assertEqual([(c["rank"], c["kind"]) for c in again["root_cause"]], [(2, "stuck")], again)
        text = subprocess.run([BALLAST, "analyze", self.traces], capture_output=True, text=True).stdout
        self.assertIn("ballast launch stopped this job", text)


class LaunchTeardownTest(unittest.TestCase):
    """No PyTorch needed: a rank whose heartbeat says done but that never
    exits (PyTorch 1.13's process group destructor can deadlock so) is
    killed after --exit-grace, and the job counts as finished."""

    def test_teardown_hang_is_killed_after_the_grace(self):
        script = ("import os, time, ballast\n"
                  "rank = int(os.environ['RANK'])\n"
                  "ballast.Heartbeat(rank=rank, world=int(os.environ['WORLD_SIZE'])).close(done=True)\n"
                  "while rank == 1:\n"
                  "    time.sleep(60)\n")
        folder = tempfile.mkdtemp(prefix="launch-teardown-")
        env = dict(os.environ, PYTHONPATH=os.path.join(SOURCE, "python"))
        env.pop("LD_PRELOAD", None)
        t0 = time.monotonic()
        r = subprocess.run([BALLAST, "launch", "-n", "2", "--exit-grace", "1", "--trace-dir",
                            os.path.join(folder, "traces"), "--", "/usr/bin/python3", "-c", script],
                           env=env, capture_output=True, text=True, timeout=60)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        self.assertRegex(out, r"rank 1 \(pid \d+\) said done \d+ s ago but has not exited: killed", out)
        self.assertLess(time.monotonic() - t0, 30, out)


@unittest.skipUnless(HAVE_TORCH, "python3-torch (with gloo) is not installed: tools/install-deps installs it")
class PyTorchStragglerTest(unittest.TestCase):
    """The ranks' step reports, received as the executor receives them (the
    job channel's datagram socket), published on a real host's bus: the
    online straggler analysis names the slowed rank."""

    def test_straggler_slowed_rank_is_named_online(self):
        import ballast
        from ballast import job as job_channel
        folder = tempfile.mkdtemp(prefix="pytorch-straggler-")
        sock_path = os.path.join(folder, "executor.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        server.bind(sock_path)
        server.settimeout(0.2)
        reports = []
        with ballast.Host() as host:
            host.load_plugin("straggler", {"window_steps": 20, "report_every": 10})
            host.subscribe("straggler.report", reports.append)
            host.start()
            env = dict(os.environ, BALLAST_JOB_SOCKET=sock_path)
            env.pop("LD_PRELOAD", None)  # the ASan runtime this test may need is not the ranks' business
            p = subprocess.Popen([BALLAST, "launch", "-n", "3", "--trace-dir", os.path.join(folder, "traces"), "--",
                                  "/usr/bin/python3", TRAIN, "--steps", "60", "--slow", "2@4"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            kinds = {}
            try:
                while True:
                    try:
                        report = json.loads(server.recv(70000))
                    except socket.timeout:
                        if p.poll() is not None:
                            break
                        continue
                    kinds[report["type"]] = kinds.get(report["type"], 0) + 1
                    if report["type"] == "step":
                        host.publish("step.timing", {"ops": job_channel.ops_of_step_report(report)})
                out = p.stdout.read()
            finally:
                if p.poll() is None:
                    p.kill()
                p.wait()
                server.close()
            self.assertEqual(p.returncode, 0, out)
            self.assertEqual((kinds.get("hello"), kinds.get("step"), kinds.get("done")), (3, 180, 3), kinds)
            deadline = time.monotonic() + 10
            while len(reports) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
        self.assertGreaterEqual(len(reports), 3, out)
        last = reports[-1]["payload"]
        print(json.dumps(last)[:400])
        ranks = [c for c in last["culprits"] if c["dimension"] == "rank"]
        self.assertTrue(ranks, last)
        self.assertEqual(ranks[0]["name"], "2", last)
        self.assertEqual(last["kind"], "worker", last)
        self.assertGreater(last["slowdown"], 1.3, last)


class UnwatchedJobTest(unittest.TestCase):
    def test_unwatched_job_is_warned_about_within_seconds(self):
        traces = tempfile.mkdtemp(prefix="unwatched-")
        p = subprocess.Popen([BALLAST, "launch", "-n", "2", "--trace-dir", traces, "--", "/usr/bin/python3", "-c",
                              "import time; time.sleep(8)"], stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        try:
            for line in p.stderr:
                if "hang detection is off" in line:
                    took = time.monotonic() - t0
                    break
            else:
                self.fail("no warning that hang detection is off")
        finally:
            p.kill()
            p.wait()
        print(f"warned after {took:.1f} s")
        self.assertIn("no trace ring and no heartbeat", line)
        self.assertLess(took, 7.5)


if __name__ == "__main__":
    unittest.main()
