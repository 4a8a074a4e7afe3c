#!/usr/bin/env python3
"""A toy training loop that uses Ballast through ctypes.

Each step it publishes its timing on `step.timing`; a recovery policy
watches the job and answers on `recovery.action`, which this loop obeys
(here: a `checkpoint_now` makes it save, a `pause`, `evict` or `escalate`
stops it). Run:

    python3 examples/python/train.py --lib build/lib/libballast.so \
        --policy examples/python/slow_step_policy.lua --steps 40 --slow-from 25
"""
import argparse
import ctypes
import json
import sys
import threading
import time


class Source(ctypes.Structure):
    _fields_ = [("node", ctypes.c_char_p), ("rank", ctypes.c_int32), ("plugin", ctypes.c_char_p)]


class Event(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("schema", ctypes.c_uint32), ("topic", ctypes.c_char_p),
                ("ts_ns", ctypes.c_int64), ("source", Source), ("payload", ctypes.c_void_p),
                ("payload_size", ctypes.c_uint64)]


HANDLER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(Event))


class SubscribeOptions(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("delivery", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("queue_capacity", ctypes.c_uint32)]


class Ballast:
    """The few calls of abi/ballast/host.h this loop needs."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        lib = self.lib
        lib.ballast_last_error.restype = ctypes.c_char_p
        lib.ballast_host_create.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.ballast_host_destroy.argtypes = [ctypes.c_void_p]
        lib.ballast_host_load_policy.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
        lib.ballast_host_start.argtypes = [ctypes.c_void_p]
        lib.ballast_host_stop.argtypes = [ctypes.c_void_p]
        lib.ballast_host_publish_json.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
        lib.ballast_host_subscribe.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(SubscribeOptions),
                                               HANDLER, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.ballast_event_to_json.argtypes = [ctypes.POINTER(Event), ctypes.c_char_p, ctypes.c_uint64]
        lib.ballast_event_to_json.restype = ctypes.c_int64
        self.host = ctypes.c_void_p()
        self._check(lib.ballast_host_create(b"python-trainer", ctypes.byref(self.host)), "create")
        self._handlers = []  # keep the ctypes callbacks alive

    def _check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"ballast {what}: {self.lib.ballast_last_error().decode()}")

    def load_policy(self, path, fallback="escalate"):
        self._check(self.lib.ballast_host_load_policy(self.host, path.encode(), fallback.encode()), "load_policy")

    def subscribe(self, pattern, fn):
        """fn(dict) is called from Ballast's dispatcher thread with the event as JSON."""
        def trampoline(_user, ev_ptr):
            try:
                buf = ctypes.create_string_buffer(4096)
                n = self.lib.ballast_event_to_json(ev_ptr, buf, len(buf))
                if n >= len(buf):
                    buf = ctypes.create_string_buffer(n + 1)
                    self.lib.ballast_event_to_json(ev_ptr, buf, len(buf))
                fn(json.loads(buf.value.decode()))
                return 0
            except Exception as e:  # never let an exception cross into C
                print(f"handler failed: {e}", file=sys.stderr)
                return -1
        handler = HANDLER(trampoline)
        self._handlers.append(handler)
        opts = SubscribeOptions(ctypes.sizeof(SubscribeOptions), 1, 0, 0)  # queued
        sub = ctypes.c_uint64()
        self._check(self.lib.ballast_host_subscribe(self.host, pattern.encode(), ctypes.byref(opts), handler, None,
                                                    ctypes.byref(sub)), "subscribe")

    def start(self):
        self._check(self.lib.ballast_host_start(self.host), "start")

    def publish(self, topic, payload):
        self._check(self.lib.ballast_host_publish_json(self.host, topic.encode(), json.dumps(payload).encode()),
                    "publish")

    def close(self):
        self.lib.ballast_host_stop(self.host)
        self.lib.ballast_host_destroy(self.host)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default="build/lib/libballast.so")
    ap.add_argument("--policy", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--slow-from", type=int, default=-1, help="steps from this one on take 4x longer")
    args = ap.parse_args()

    ballast = Ballast(args.lib)
    ballast.load_policy(args.policy)
    actions = []
    stop = threading.Event()

    def on_action(ev):
        p = ev["payload"]
        actions.append(p["action"])
        print(f"recovery.action: {p['action']} {p.get('subject') or '(job)'}: {p.get('reason', '')}")
        if p["action"] in ("pause", "evict", "escalate"):
            stop.set()

    ballast.subscribe("recovery.action", on_action)
    ballast.start()
    checkpoints = 0
    step = 0
    for step in range(args.steps):
        if stop.is_set():
            break
        t0 = time.time()
        time.sleep(args.step_ms / 1000 * (4 if 0 <= args.slow_from <= step else 1))  # "compute"
        duration = time.time() - t0
        ballast.publish("step.timing", {"ops": [{"dp_rank": 0, "stage": 0, "rank": 0, "step": step,
                                                  "optype": "step", "start_s": t0, "duration_s": duration,
                                                  "seq_id": 0, "mc": -1, "mb_id": -1, "gmc": -1}]})
        if "checkpoint_now" in actions[checkpoints:]:
            checkpoints = len(actions)
            print(f"step {step}: checkpoint saved")
    time.sleep(0.2)  # let the policy answer the last steps
    ballast.close()
    print(f"trained {step + 1} step(s); actions: {actions}")
    return 0 if actions else 1


if __name__ == "__main__":
    sys.exit(main())
