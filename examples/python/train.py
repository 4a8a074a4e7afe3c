#!/usr/bin/env python3
"""A toy training loop that uses Ballast through the `ballast` package.

Each step is timed by a ballast.StepTimer that publishes step.timing on an
embedded host; a recovery policy watches the job and answers on
recovery.action, which the loop obeys through ballast.Actions at step
boundaries (here: a `checkpoint_now` makes it save, a `pause`, `evict` or
`escalate` stops it). Run, from the source tree:

    PYTHONPATH=python python3 examples/python/train.py --lib build/lib/libballast.so \\
        --policy examples/python/slow_step_policy.lua --steps 40 --slow-from 25

(with the package installed, PYTHONPATH and --lib are not needed).
"""
import argparse
import os
import sys
import time

try:
    import ballast
except ImportError:  # run from the source tree without PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import ballast


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=None, help="libballast.so (default: $BALLAST_LIB, else the installed one)")
    ap.add_argument("--policy", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--slow-from", type=int, default=-1, help="steps from this one on take 4x longer")
    args = ap.parse_args()

    seen = []
    stop = []
    actions = ballast.Actions(rank=0)

    def log(action):
        seen.append(action.action)
        print(f"recovery.action: {action.action} {action.subject or '(job)'}: {action.reason or ''}")

    for name in ("checkpoint_now", "pause", "evict", "escalate"):
        actions.on(name, log)
    actions.on("checkpoint_now", lambda a: print(f"step {timer.current_step}: checkpoint saved"))
    for name in ("pause", "evict", "escalate"):
        actions.on(name, stop.append)

    with ballast.Host("python-trainer", lib=args.lib) as host:
        host.load_policy(args.policy)
        actions.subscribe(host)
        host.start()
        timer = ballast.StepTimer(rank=0, sinks=[ballast.publish_to(host)])
        step = 0
        for step in range(args.steps):
            with timer.step(step):
                time.sleep(args.step_ms / 1000 * (4 if 0 <= args.slow_from <= step else 1))  # "compute"
                actions.poll()  # the step boundary: obey what the policy said
            if stop:
                break
        time.sleep(0.2)  # let the policy answer the last steps
        actions.poll()
    print(f"trained {step + 1} step(s); actions: {seen}")
    return 0 if seen else 1


if __name__ == "__main__":
    sys.exit(main())
