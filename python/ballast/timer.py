"""The step timer: times each training step and its phases, and hands the
rows of step.timing (ballast.events.op_timing) to its sinks: a Host's bus,
the executor's job channel, the heartbeat."""
import contextlib
import functools
import os
import time

from . import events


class StepTimer:
    """with timer.step(n): ... times step n; inside it, with
    timer.phase("forward-compute", mb_id=k): ... times a phase (phases may
    also be switched with begin(), e.g. from a framework's hook). Each step
    ends by calling every sink as sink(step, ops, start_s, duration_s); ops
    are op_timing rows, one per phase, or one "step" row when no phase was
    timed. Used as a decorator (@timer), each call of the function is a
    step, numbered from 1 on."""

    def __init__(self, rank=None, dp_rank=None, stage=0, sinks=(), heartbeat=None):
        self.rank = int(os.environ.get("RANK", "0") if rank is None else rank)
        self.dp_rank = self.rank if dp_rank is None else int(dp_rank)
        self.stage = int(stage)
        self.sinks = list(sinks)
        self.heartbeat = heartbeat
        self.last_ops = []
        self.last_duration = None
        self._step = None
        self._ops = []
        self._phase = None  # (optype, mb_id, perf start)
        self._next_auto = 1
        self._perf0 = time.perf_counter()
        self._wall0 = time.time()

    def _wall(self, perf):
        return self._wall0 + (perf - self._perf0)

    def _beat(self, phase=None):
        if self.heartbeat is not None:
            self.heartbeat.beat(step=self._step, phase=phase)

    @property
    def current_step(self):
        return self._step

    @contextlib.contextmanager
    def step(self, step=None):
        if self._step is not None:
            raise RuntimeError(f"step {step} begun inside step {self._step}")
        self._step = self._next_auto if step is None else int(step)
        self._next_auto = self._step + 1
        self._ops = []
        t0 = time.perf_counter()
        self._beat()
        try:
            yield self
        except BaseException:
            self._phase = None
            self._step = None
            raise
        self.end_phase()
        t1 = time.perf_counter()
        step_no, ops = self._step, self._ops
        if not ops:
            ops = [events.op_timing(self.rank, step_no, "step", self._wall(t0), t1 - t0, self.dp_rank, self.stage)]
        self.last_ops, self.last_duration = ops, t1 - t0
        self._step = None
        self._beat()
        for sink in self.sinks:
            sink(step_no, ops, self._wall(t0), t1 - t0)

    def begin(self, optype, mb_id=-1):
        """End the phase in progress, if any, and begin `optype`."""
        if self._step is None:
            raise RuntimeError(f"phase {optype} begun outside a step")
        self.end_phase()
        self._phase = (optype, int(mb_id), time.perf_counter())
        self._beat(optype)

    def end_phase(self):
        if self._phase is None:
            return
        optype, mb_id, t0 = self._phase
        self._phase = None
        self.add_op(optype, self._wall(t0), time.perf_counter() - t0, mb_id)
        self._beat()

    def add_op(self, optype, start_s, duration_s, mb_id=-1):
        """Add a phase timed elsewhere to the step in progress."""
        seq = sum(1 for o in self._ops if o["optype"] == optype)
        self._ops.append(events.op_timing(self.rank, self._step, optype, start_s, duration_s, self.dp_rank,
                                          self.stage, seq_id=seq, mb_id=mb_id))

    @contextlib.contextmanager
    def phase(self, optype, mb_id=-1):
        self.begin(optype, mb_id)
        try:
            yield
        finally:
            self.end_phase()

    def __call__(self, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            with self.step():
                return fn(*args, **kwargs)
        return timed


def publish_to(host):
    """A sink that publishes each step's rows on host's bus (step.timing)."""
    def sink(_step, ops, _start, _duration):
        host.publish(events.STEP_TIMING, events.step_timing(ops))
    return sink
