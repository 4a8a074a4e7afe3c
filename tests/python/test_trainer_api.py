"""The trainer side of the package, without libballast: the step timer, the
heartbeat file (and its Python stacks on a signal), the executor's job
channel over a real datagram socket and control file, atomic writes."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

import ballast
from ballast import heartbeat, job


def read_heartbeat(path):
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) == heartbeat.SIZE and data.endswith(b"\n"), data
    text, _, checksum = data.rstrip().rpartition(b" sum=")
    assert int(checksum, 16) == heartbeat.fnv1a32(text), data
    return dict(kv.split("=", 1) for kv in text.decode().split())


class TimerTest(unittest.TestCase):
    def test_phases_become_rows_and_sinks_get_each_step(self):
        got = []
        timer = ballast.StepTimer(rank=2, sinks=[lambda *a: got.append(a)])
        with timer.step(5):
            for mb in range(2):
                with timer.phase("forward-compute", mb_id=mb):
                    time.sleep(0.01)
                with timer.phase("backward-compute", mb_id=mb):
                    pass
            timer.begin("separate-grads-all-reduce")
            timer.begin("optimizer")
        step, ops, start, duration = got[0]
        self.assertEqual(step, 5)
        self.assertEqual([(o["optype"], o["seq_id"], o["mb_id"]) for o in ops],
                         [("forward-compute", 0, 0), ("backward-compute", 0, 0), ("forward-compute", 1, 1),
                          ("backward-compute", 1, 1), ("separate-grads-all-reduce", 0, -1), ("optimizer", 0, -1)])
        self.assertTrue(all(o["rank"] == 2 and o["dp_rank"] == 2 and o["step"] == 5 for o in ops))
        self.assertGreaterEqual(ops[0]["duration_s"], 0.009)
        self.assertLessEqual(start, ops[0]["start_s"])
        self.assertGreaterEqual(duration, sum(o["duration_s"] for o in ops) - 1e-6)
        # ops start in order, one after another
        for a, b in zip(ops, ops[1:]):
            self.assertLessEqual(a["start_s"] + a["duration_s"], b["start_s"] + 1e-6)

    def test_decorator_numbers_steps_and_a_bare_step_is_one_row(self):
        got = []
        timer = ballast.StepTimer(rank=0, sinks=[lambda s, ops, *_: got.append((s, [o["optype"] for o in ops]))])

        @timer
        def train_step():
            return 42

        self.assertEqual(train_step(), 42)
        train_step()
        self.assertEqual(got, [(1, ["step"]), (2, ["step"])])

    def test_a_failing_step_reports_nothing_and_the_timer_goes_on(self):
        got = []
        timer = ballast.StepTimer(rank=0, sinks=[lambda *a: got.append(a)])
        with self.assertRaises(KeyError):
            with timer.step(1):
                timer.begin("forward-compute")
                raise KeyError("x")
        with timer.step(2):
            pass
        self.assertEqual([g[0] for g in got], [2])
        with self.assertRaises(RuntimeError):
            timer.begin("forward-compute")


class HeartbeatTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def test_file_is_rewritten_in_place_with_progress(self):
        hb = ballast.Heartbeat(self.dir, rank=1, world=4, stack_signal=0)
        path = os.path.join(self.dir, f"rank-1.{os.getpid()}.heartbeat")
        self.assertEqual(hb.path, path)
        first = read_heartbeat(path)
        self.assertEqual((first["ballast-heartbeat"], first["rank"], first["world"], first["beat"], first["state"]),
                         ("1", "1", "4", "0", "running"))
        ino = os.stat(path).st_ino
        timer = ballast.StepTimer(rank=1, heartbeat=hb)
        with timer.step(9):
            timer.begin("separate-grads-all-reduce")
            now = read_heartbeat(path)
            self.assertEqual((now["step"], now["phase"], now["comm"]), ("9", "separate-grads-all-reduce", "1"))
            timer.begin("optimizer")
            self.assertEqual(read_heartbeat(path)["comm"], "0")
        after = read_heartbeat(path)
        self.assertGreater(int(after["beat"]), 3)
        self.assertGreaterEqual(int(after["wall_ns"]), int(first["wall_ns"]))
        self.assertEqual(os.stat(path).st_ino, ino)
        hb.close()
        self.assertEqual(read_heartbeat(path)["state"], "done")
        self.assertFalse([n for n in os.listdir(self.dir) if n.endswith(".part")])

    def test_stack_signal_appends_every_threads_python_stack(self):
        script = textwrap.dedent(f"""
            import sys, time, ballast
            hb = ballast.Heartbeat({self.dir!r}, rank=0, world=1)
            def waiting_in_the_collective():
                print(hb.stack_signal, flush=True)
                time.sleep(30)
            waiting_in_the_collective()
        """)
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            sig = int(p.stdout.readline())
            self.assertEqual(sig, int(signal.SIGUSR2))
            self.assertEqual(read_heartbeat(os.path.join(self.dir, f"rank-0.{p.pid}.heartbeat"))["stack_signal"],
                             str(sig))
            os.kill(p.pid, sig)
            stack = os.path.join(self.dir, f"rank-0.{p.pid}.stack")
            deadline = time.monotonic() + 10
            text = ""
            while "waiting_in_the_collective" not in text and time.monotonic() < deadline:
                time.sleep(0.05)
                with open(stack) as f:
                    text = f.read()
            self.assertIn("waiting_in_the_collective", text)
            self.assertIsNone(p.poll())  # the process goes on
        finally:
            p.kill()
            p.wait()

    def test_needs_a_folder(self):
        env = dict(os.environ)
        os.environ.pop("BALLAST_TRACE_DIR", None)
        try:
            with self.assertRaises(ValueError):
                ballast.Heartbeat()
        finally:
            os.environ.clear()
            os.environ.update(env)


class JobChannelTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.sock_path = os.path.join(self.dir, "executor.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.server.bind(self.sock_path)
        self.server.settimeout(5)
        self.control = os.path.join(self.dir, "control.jsonl")
        self.env = {"RANK": "1", "WORLD_SIZE": "2", "BALLAST_JOB_SOCKET": self.sock_path,
                    "BALLAST_CONTROL_FILE": self.control, "BALLAST_CHECKPOINT_DIR": os.path.join(self.dir, "ckpt"),
                    "BALLAST_ATTEMPT": "2", "BALLAST_INJECT": "nan@12,usererror@30"}

    def tearDown(self):
        self.server.close()

    def recv(self):
        return json.loads(self.server.recv(70000))

    def test_reports_are_datagrams_of_the_contract(self):
        j = job.Job(self.env)
        self.assertTrue(j.supervised)
        self.assertEqual(j.inject, {"nan": [12], "usererror": [30]})
        j.hello(4)
        self.assertEqual(self.recv(), {"type": "hello", "rank": 1, "pid": os.getpid(), "step": 4, "attempt": 2})
        timer = ballast.StepTimer(rank=1, sinks=[j.timer_sink(lambda: 0.5)])
        with timer.step(5):
            timer.begin("forward-compute")
        r = self.recv()
        self.assertEqual((r["type"], r["step"], r["loss"], r["ops"][0]["optype"]), ("step", 5, 0.5, "forward-compute"))
        self.assertAlmostEqual(r["start_s"], time.time(), delta=5)
        j.checkpoint(5, "/x/step-00000005.pt", 100, 0.1)
        self.assertEqual(self.recv()["type"], "checkpoint")
        j.error(6, "nan", "loss is NaN")
        self.assertEqual(self.recv()["kind"], "nan")
        j.done(6)
        self.assertEqual(self.recv(), {"type": "done", "rank": 1, "step": 6})
        with self.assertRaises(ValueError):
            j.error(6, "oops", "x")

    def test_a_gone_executor_drops_reports_without_failing(self):
        self.server.close()
        os.unlink(self.sock_path)
        j = job.Job(self.env)
        self.assertFalse(j.hello(0))
        self.assertEqual(j.dropped, 1)

    def test_a_full_queue_drops_step_reports_and_holds_the_others_up_to_a_second(self):
        j = job.Job(self.env)
        sent = 0
        while j.step(sent, 0.5, time.time(), 0.01):  # fill the executor's queue (max_dgram_qlen)
            sent += 1
        self.assertGreater(sent, 0)
        self.assertEqual(j.dropped, 1)  # the step report that found it full, at once
        # Nobody reads: a done report waits its second, then is dropped.
        t0 = time.monotonic()
        self.assertFalse(j.done(7))
        self.assertGreaterEqual(time.monotonic() - t0, 1.0)
        self.assertEqual(j.dropped, 2)
        # The executor reads after 0.2 s: the error report gets through, after the steps.
        types = []

        def read():
            while not types or types[-1] != "error":
                types.append(self.recv()["type"])
        reader = threading.Timer(0.2, read)
        reader.start()
        self.assertTrue(j.error(8, "nan", "loss is NaN"))
        reader.join()
        self.assertEqual(types, ["step"] * sent + ["error"])

    def test_unsupervised_without_the_variables(self):
        j = job.Job({"RANK": "0"})
        self.assertFalse(j.supervised)
        self.assertFalse(j.hello(0))
        self.assertEqual(j.commands(), [])

    def test_commands_read_whole_lines_for_this_rank(self):
        j = job.Job(self.env)
        self.assertEqual(j.commands(), [])  # no file yet
        with open(self.control, "w") as f:
            f.write('{"seq": 1, "command": "checkpoint_now"}\n{"seq": 2, "command": "skip", "rank": 0}\n')
            f.write('{"seq": 3, "command": "slow", "rank": 1, "factor": 3}\nnot json\n{"seq": 4, "comm')
        self.assertEqual([c["seq"] for c in j.commands()], [1, 3])
        self.assertEqual(len(j.bad_commands), 1)
        self.assertIn("not json", j.bad_commands[0][0])
        with open(self.control, "a") as f:
            f.write('and": "stop"}\n')
        actions = ballast.Actions(rank=1)
        stops = []
        actions.on("stop", stops.append)
        self.assertEqual([c["seq"] for c in j.deliver_commands(actions)], [4])
        actions.poll()
        self.assertTrue(actions.stopping)
        self.assertEqual(stops[0].args, {"seq": 4})

    def test_bad_inject_is_named(self):
        with self.assertRaises(ValueError) as e:
            job.Job({"BALLAST_INJECT": "nan@x"})
        self.assertIn("nan@x", str(e.exception))

    def test_checkpoints_are_written_atomically_and_the_newest_found(self):
        j = job.Job(self.env)
        self.assertIsNone(j.latest_checkpoint())
        for step in (4, 12, 8):
            n, _ = ballast.write_atomically(j.checkpoint_path(step, "pt"), lambda f: f.write(b"x" * step))
            self.assertEqual(n, step)
        self.assertEqual(os.path.basename(j.latest_checkpoint()), "step-00000012.pt")
        self.assertEqual(os.path.basename(j.latest_checkpoint(at_or_before=10)), "step-00000008.pt")

        def fails(f):
            f.write(b"half")
            raise OSError("disk full")
        with self.assertRaises(OSError):
            ballast.write_atomically(j.checkpoint_path(20, "pt"), fails)
        self.assertEqual(sorted(os.listdir(j.checkpoint_dir)),
                         ["step-00000004.pt", "step-00000008.pt", "step-00000012.pt"])


class CheckpointTest(unittest.TestCase):
    def test_safetensors_round_trip_and_bad_files_named(self):
        import struct
        from ballast import checkpoint
        folder = tempfile.mkdtemp()
        path = os.path.join(folder, "step-00000012.safetensors")
        w = struct.pack("<6f", *range(6))
        n, _ = checkpoint.save(path, {"w": ("F32", [2, 3], w), "b": ("BF16", [1], b"ab")},
                               {"step": 12, "seed": 1})
        self.assertEqual(n, os.path.getsize(path))
        (hlen,) = struct.unpack("<Q", open(path, "rb").read(8))
        self.assertEqual(hlen % 8, 0)
        tensors, meta = checkpoint.load(path)
        self.assertEqual(tensors["w"], ("F32", [2, 3], w))
        self.assertEqual(tensors["b"], ("BF16", [1], b"ab"))
        self.assertEqual(meta, {"step": "12", "seed": "1"})
        self.assertEqual(checkpoint.step_of(path), 12)
        with self.assertRaises(ValueError):
            checkpoint.save(path, {"w": ("F32", [2, 3], b"short")})
        bad = os.path.join(folder, "bad.safetensors")
        with open(bad, "wb") as f:
            f.write(struct.pack("<Q", 1 << 40) + b"{}")
        with self.assertRaises(checkpoint.FormatError) as e:
            checkpoint.load(bad)
        self.assertIn("header length", str(e.exception))
        header = b'{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'
        with open(bad, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + b"x" * 8)
        with self.assertRaises(checkpoint.FormatError) as e:
            checkpoint.load(bad)
        self.assertIn("tensor w", str(e.exception))


if __name__ == "__main__":
    unittest.main()
