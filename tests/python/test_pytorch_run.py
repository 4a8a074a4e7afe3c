"""examples/pytorch under `ballast run` (the executor, the hang detector on
heartbeats, the default policy): a crash and a hang injected, each detected,
the job restarted from its newest checkpoint, trained to the end. Skipped
without python3-torch."""
import json
import os
import re
import subprocess
import tempfile
import unittest

from test_pytorch_launch import BALLAST, HAVE_TORCH, SOURCE


@unittest.skipUnless(HAVE_TORCH, "python3-torch (with gloo) is not installed: tools/install-deps installs it")
class PyTorchRunTest(unittest.TestCase):
    def test_run_crash_and_hang_detected_and_resumed_from_checkpoints(self):
        folder = tempfile.mkdtemp(prefix="pytorch-run-")
        config = os.path.join(SOURCE, "examples", "pytorch", "pytorch.lua")
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        env["TMPDIR"] = folder  # the job's folder (logs, checkpoints) is made here
        r = subprocess.run([BALLAST, "run", config, "--json", "--inject", "crash:rank=1@step40", "--inject",
                            "hang:rank=2@step90"], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        report = json.loads(r.stdout)
        self.assertEqual(report["state"], "finished", out)
        self.assertEqual(report["steps"], 150, out)
        incidents = report["incidents"]
        self.assertEqual(len(incidents), 2, json.dumps(incidents, indent=1))
        crash, hang = incidents
        self.assertEqual(crash["verdict"], "crashed rank:1", crash)
        self.assertEqual(hang["detector"], "hang", hang)
        self.assertIn("rank:2", hang["verdict"], hang)
        for i in incidents:
            self.assertEqual(i["outcome"], "recovered", i)
        # Each restart resumed from a checkpoint: the ranks said so in their logs.
        logs = ""
        for root, _, files in os.walk(folder):
            for name in files:
                if name.startswith("rank-0") and name.endswith(".log"):
                    with open(os.path.join(root, name), errors="replace") as f:
                        logs += f.read()
        resumed = re.findall(r"resumed from \S*step-(\d{8})\.safetensors at step (\d+)", logs)
        self.assertGreaterEqual(len(resumed), 2, logs[-3000:])
        for ckpt, step in resumed:
            self.assertGreater(int(ckpt), 0)
            self.assertEqual(int(step), int(ckpt) + 1)


if __name__ == "__main__":
    unittest.main()
