"""Typed helpers for the well-known events (abi/ballast/events.h): payload
dicts with the C structs' field names, which Host.publish converts to the
structs, and readers for the events a trainer receives."""
import math
import time
from collections import namedtuple

STEP_TIMING = "step.timing"
METRIC_SAMPLE = "metric.sample"
FAULT_SUSPECTED = "fault.suspected"
FAULT_CONFIRMED = "fault.confirmed"
RECOVERY_ACTION = "recovery.action"
STRAGGLER_REPORT = "straggler.report"
COLLECTIVE_RECORD = "collective.record"
STARTUP_STAGE = "startup.stage"

ACTIONS = ("restart", "evict", "replace", "rollback", "checkpoint_now", "pause", "stop", "escalate", "resume")


def _finite(name, value):
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} is {value}, not a finite number")
    return value


def op_timing(rank, step, optype, start_s, duration_s, dp_rank=None, stage=0, seq_id=0, mb_id=-1, mc=-1, gmc=-1):
    """One row of step.timing (ballast_op_timing). dp_rank defaults to rank
    (plain data parallelism); optype is one of the straggler analysis's
    names ("forward-compute", "backward-compute", "separate-grads-all-reduce",
    "optimizer", ...) or "step" for a whole step."""
    if duration_s < 0:
        raise ValueError(f"duration_s is {duration_s}, negative")
    return {"dp_rank": rank if dp_rank is None else int(dp_rank), "stage": int(stage), "rank": int(rank),
            "step": int(step), "optype": str(optype), "start_s": _finite("start_s", start_s),
            "duration_s": _finite("duration_s", duration_s), "seq_id": int(seq_id), "mc": int(mc),
            "mb_id": int(mb_id), "gmc": int(gmc)}


def step_timing(ops):
    """The payload of step.timing: a batch of op_timing rows."""
    return {"ops": list(ops)}


def metric_samples(node, values, ts_ns=None):
    """The payload of metric.sample: values is {metric: value}."""
    ts = int(ts_ns if ts_ns is not None else time.time_ns())
    return {"samples": [{"node": node, "metric": m, "ts_ns": ts, "value": float(v), "flags": 0}
                        for m, v in values.items()]}


def fault_report(stage, subject, kind, rank=-1, metric=None, score=0.0, confidence=1.0, since_ns=0,
                 detected_ns=None, evidence=None, detector=None):
    """The payload of fault.suspected / fault.confirmed (ballast_fault_report);
    stage is "suspected" or "confirmed", evidence a dict or None."""
    if stage not in ("suspected", "confirmed"):
        raise ValueError(f"stage is {stage!r}, not 'suspected' or 'confirmed'")
    p = {"stage": stage, "subject": subject, "kind": kind, "rank": int(rank), "score": float(score),
         "confidence": float(confidence), "since_ns": int(since_ns),
         "detected_ns": int(detected_ns if detected_ns is not None else time.time_ns())}
    if metric is not None:
        p["metric"] = metric
    if evidence is not None:
        p["evidence"] = evidence
    if detector is not None:
        p["detector"] = detector
    return p


def recovery_action(action, subject=None, reason=None, args=None, policy=None):
    """The payload of recovery.action (ballast_recovery_action)."""
    p = {"action": action}
    for key, value in (("subject", subject), ("reason", reason), ("args", args), ("policy", policy)):
        if value is not None:
            p[key] = value
    return p


Action = namedtuple("Action", "action subject reason args policy")


def action_of(event):
    """A recovery.action event (as a subscriber gets it) as an Action."""
    p = event.get("payload") or {}
    if "action" not in p:
        raise ValueError(f"event on '{event.get('topic')}' has no action in its payload")
    return Action(p["action"], p.get("subject"), p.get("reason"), p.get("args"), p.get("policy"))
