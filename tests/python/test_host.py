"""ballast.Host over the libballast of this build: plugins, a policy,
publish and subscribe through the real bus, C failures as exceptions."""
import os
import tempfile
import threading
import time
import unittest

import ballast
from ballast import events

POLICY = """
ballast.on("step.timing", function(ev)
  local op = ev.payload.ops[1]
  if op.duration_s > 1.0 then
    return { action = "checkpoint_now", subject = "rank:" .. op.rank, reason = "slow step " .. op.step }
  end
end)
"""


def wait_for(predicate, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


class HostTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def policy(self, text=POLICY):
        path = os.path.join(self.dir, "policy.lua")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_publish_reaches_subscriber_and_policy_answers(self):
        with ballast.Host("test-node") as host:
            host.load_policy(self.policy())
            got, actions = [], ballast.Actions(rank=3)
            host.subscribe("step.timing", got.append)
            actions.subscribe(host)
            host.start()
            host.publish(events.STEP_TIMING, events.step_timing(
                [events.op_timing(3, 7, "forward-compute", time.time(), 0.01)]))
            host.publish(events.STEP_TIMING, events.step_timing([events.op_timing(3, 8, "step", time.time(), 2.5)]))
            self.assertTrue(wait_for(lambda: len(got) == 2))
            op = got[0]["payload"]["ops"][0]
            self.assertEqual((op["rank"], op["step"], op["optype"], op["dp_rank"]), (3, 7, "forward-compute", 3))
            self.assertEqual(got[0]["schema"], "op_timing_batch")  # converted to ballast_op_timing_batch, and back
            seen = []
            actions.on("checkpoint_now", seen.append)
            self.assertTrue(wait_for(lambda: actions.poll() or seen))
            self.assertEqual(seen[0].action, "checkpoint_now")
            self.assertEqual(seen[0].subject, "rank:3")
            self.assertIn("slow step 8", seen[0].reason)
            self.assertEqual(host.handler_errors, 0)

    def test_actions_for_another_rank_are_ignored(self):
        actions = ballast.Actions(rank=1)
        actions.deliver(events.recovery_action("checkpoint_now", subject="rank:2"))
        actions.deliver(events.recovery_action("stop"))
        self.assertEqual([a.action for a in actions.poll()], ["stop"])
        self.assertTrue(actions.stopping)

    def test_pause_waits_for_resume(self):
        actions = ballast.Actions()
        actions.deliver({"action": "pause"})
        t0 = time.monotonic()
        threading.Timer(0.2, lambda: actions.deliver({"action": "resume"})).start()
        self.assertEqual([a.action for a in actions.poll()], ["pause"])
        self.assertGreaterEqual(time.monotonic() - t0, 0.15)

    def test_c_errors_are_exceptions_with_the_last_error(self):
        with ballast.Host() as host:
            with self.assertRaises(ballast.Error) as e:
                host.load_plugin(os.path.join(self.dir, "no-such-plugin.so"))
            self.assertIn("no-such-plugin.so", str(e.exception))
            self.assertLess(e.exception.status, 0)
            with self.assertRaises(ballast.Error) as e:
                host.load_policy(os.path.join(self.dir, "missing.lua"))
            self.assertIn("missing.lua", str(e.exception))
            with self.assertRaises(ballast.Error) as e:
                host.load_policy(self.policy("this is not lua"))
            self.assertIn("policy.lua", str(e.exception))
            with self.assertRaises(ballast.Error) as e:
                host.counter("no.such.counter")
            self.assertTrue(e.exception.message)
        with self.assertRaises(ballast.Error) as e:
            host.start()  # closed
        self.assertIn("closed", str(e.exception))

    def test_bundled_plugin_by_name_with_a_config_dict(self):
        with ballast.Host() as host:
            host.load_plugin("straggler", {"window_steps": 4, "report_every": 2})
            with self.assertRaises(ballast.Error) as e:
                host.load_plugin("hang", {"stall_seconds": -1})
            self.assertIn("stall_seconds", str(e.exception))
            host.start()

    def test_handler_exceptions_are_counted_not_fatal(self):
        with ballast.Host() as host:
            def bad(_ev):
                raise RuntimeError("boom")
            host.subscribe("custom.topic", bad, queued=False)
            host.start()
            host.publish("custom.topic", {"x": 1})
            self.assertEqual(host.handler_errors, 1)

    def test_to_lua(self):
        self.assertEqual(ballast.to_lua({"a": 1, "b": [True, None, 2.5], "end": "x\"y\n"}),
                         '{ a = 1, b = {true, nil, 2.5}, ["end"] = "x\\034y\\010" }')
        with self.assertRaises(ValueError):
            ballast.to_lua({"a": float("nan")})
        with self.assertRaises(ValueError):
            ballast.to_lua({1: 2})
        deep = []
        for _ in range(40):
            deep = [deep]
        with self.assertRaises(ValueError):
            ballast.to_lua(deep)

    def test_typed_helpers_refuse_bad_values(self):
        with self.assertRaises(ValueError):
            events.op_timing(0, 1, "forward-compute", time.time(), -1)
        with self.assertRaises(ValueError):
            events.op_timing(0, 1, "forward-compute", float("inf"), 1)
        with self.assertRaises(ValueError):
            events.fault_report("maybe", "rank:1", "stuck")


if __name__ == "__main__":
    unittest.main()
