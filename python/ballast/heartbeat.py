"""The heartbeat file: how a rank that writes no trace ring (a PyTorch job
on gloo or NCCL without Ballast's comm plugins) tells `ballast launch` and
the hang detector that it makes progress, and where.

One file per process, "<BALLAST_TRACE_DIR>/rank-<R>.<PID>.heartbeat", of
exactly 512 bytes: one line of ASCII `key=value` fields separated by spaces,
padded with spaces, ending in "\\n", rewritten in place with one pwrite at
offset 0 on each change. Fields, in this order:

  ballast-heartbeat=1 rank=R world=N pid=P host=H beat=B step=S phase=NAME comm=0|1
  wall_ns=T stack_signal=SIG state=running|done|failed sum=XXXXXXXX

host is the writer's host name (its pid means nothing elsewhere), beat
counts progress (a step or phase began or ended), wall_ns is the
CLOCK_REALTIME ns of the last beat, step the step in progress, phase what
it does ("-" between phases), comm 1 while that phase is a collective the
other ranks take part in. stack_signal: the signal on which the process
appends its Python stacks to "rank-<R>.<PID>.stack" beside it (0: none; a
reader must not send it otherwise). sum: FNV-1a 32 of every byte before
" sum=", in hex: a reader that sees another value read a torn update and
reads again. state: done once the process finished its work, failed when
it ended on an error of its own (an exception), running until then. The file is made complete under another name and renamed into
place. No library is needed to write it: see docs in
plugins/detector/hang/README.md."""
import faulthandler
import os
import signal
import socket
import time

SIZE = 512
_COMM_WORDS = ("all-reduce", "allreduce", "all-gather", "allgather", "reduce-scatter", "broadcast", "barrier",
               "send", "recv", "all-to-all", "alltoall")


def fnv1a32(data):
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def is_communication(phase):
    """Whether a phase's name says it is a collective (all-reduce, ...)."""
    p = phase.lower()
    return any(w in p for w in _COMM_WORDS)


def stack_path(directory, rank, pid):
    return os.path.join(directory, f"rank-{rank}.{pid}.stack")


class Heartbeat:
    """The heartbeat file of this process. beat() records progress; the step
    timer calls it at each step and phase. With stack_signal (default
    SIGUSR2, $BALLAST_STACK_SIGNAL to change, 0 for none), faulthandler
    appends every thread's Python stack to the .stack file on that signal,
    from then until the process ends (close() leaves it installed)."""

    def __init__(self, directory=None, rank=None, world=None, stack_signal=None):
        env = os.environ
        self.directory = directory or env.get("BALLAST_TRACE_DIR")
        if not self.directory:
            raise ValueError("no folder for the heartbeat: give one or set BALLAST_TRACE_DIR")
        self.rank = int(env.get("RANK", "0") if rank is None else rank)
        self.world = int(env.get("WORLD_SIZE", "1") if world is None else world)
        self.pid = os.getpid()
        self.host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-_.")[:63] or "-"
        if stack_signal is None:
            stack_signal = int(env.get("BALLAST_STACK_SIGNAL", int(signal.SIGUSR2)))
        self.stack_signal = int(stack_signal)
        self.path = os.path.join(self.directory, f"rank-{self.rank}.{self.pid}.heartbeat")
        self.beats = 0
        self.step = 0
        self.phase = "-"
        self.state = "running"
        self._stack_file = None
        if self.stack_signal:
            self._stack_file = open(stack_path(self.directory, self.rank, self.pid), "ab", buffering=0)
            faulthandler.register(self.stack_signal, file=self._stack_file, all_threads=True, chain=False)
        part = self.path + ".part"
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, self._line())
            os.rename(part, self.path)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _line(self):
        comm = 1 if self.phase != "-" and is_communication(self.phase) else 0
        text = (f"ballast-heartbeat=1 rank={self.rank} world={self.world} pid={self.pid} host={self.host} "
                f"beat={self.beats} "
                f"step={self.step} phase={self.phase} comm={comm} wall_ns={time.time_ns()} "
                f"stack_signal={self.stack_signal} state={self.state}")
        text = text.encode("ascii", "replace")
        line = text + b" sum=%08x" % fnv1a32(text)
        if len(line) > SIZE - 1:
            raise ValueError(f"heartbeat line of {len(line)} bytes exceeds {SIZE - 1}: phase name too long?")
        return line + b" " * (SIZE - 1 - len(line)) + b"\n"

    def beat(self, step=None, phase=None):
        """Record progress: now at `step` (when given), in `phase` ("-" or
        None: between phases)."""
        if self._fd is None:
            return
        if step is not None:
            self.step = int(step)
        self.phase = "-" if not phase else "".join(c if c.isalnum() or c in "-_." else "_" for c in phase)[:48]
        self.beats += 1
        os.pwrite(self._fd, self._line(), 0)

    def close(self, done=True):
        """Mark the process finished (state=done, or failed with done False)
        and close the file."""
        if self._fd is None:
            return
        self.state = "done" if done else "failed"
        self.beat(step=None, phase=None if done else self.phase)
        os.close(self._fd)
        self._fd = None
        # The stack handler stays until the process ends: a reader that saw
        # stack_signal a moment ago may still send it, and with the handler
        # gone the signal's default action would end the process.

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        self.close(done=exc_type is None)
        return False
