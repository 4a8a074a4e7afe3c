"""The job channel (docs/job-channel.md): a supervised rank's side of the
contract with the executor of `ballast run`. Reports go as JSON datagrams to
BALLAST_JOB_SOCKET; commands come from the append-only BALLAST_CONTROL_FILE,
read at step boundaries. Unset variables make the rank unsupervised: reports
are not sent and no command comes. Nothing here needs libballast."""
import json
import math
import os
import re
import socket
import time

from . import events

MAX_REPORT = 64 * 1024
MAX_COMMAND_LINE = 64 * 1024
_CHECKPOINT = re.compile(r"^step-(\d{8})\.[A-Za-z0-9_.]+$")


class Job:
    """The environment a launcher or the executor gave this rank, and the
    channel to the executor."""

    def __init__(self, env=None):
        env = os.environ if env is None else env
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.local_rank = int(env.get("LOCAL_RANK", str(self.rank)))
        self.attempt = int(env.get("BALLAST_ATTEMPT", "0") or 0)
        self.trace_dir = env.get("BALLAST_TRACE_DIR") or None
        self.job_dir = env.get("BALLAST_JOB_DIR") or None
        self.checkpoint_dir = env.get("BALLAST_CHECKPOINT_DIR") or None
        self.resume_from = env.get("BALLAST_RESUME_FROM") or None
        self.socket_path = env.get("BALLAST_JOB_SOCKET") or None
        self.control_path = env.get("BALLAST_CONTROL_FILE") or None
        self.inject = parse_inject(env.get("BALLAST_INJECT", ""))
        self.dropped = 0  # reports that could not be sent
        self.bad_commands = []  # (line, why) of command lines that were not understood
        self._sock = None
        self._control_offset = 0
        self._partial = b""
        if self.socket_path:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)

    @property
    def supervised(self):
        return self.socket_path is not None

    # ---- reports ---------------------------------------------------------
    def report(self, type_, **fields):
        """Send one report; a failure (executor gone, buffer full) is counted
        in `dropped`, never raised: training must not depend on it."""
        if self._sock is None:
            return False
        try:
            data = json.dumps({"type": type_, "rank": self.rank, **fields}, allow_nan=False).encode()
            if len(data) > MAX_REPORT:
                fields.pop("ops", None)  # the step's rows are the only field that can grow
                data = json.dumps({"type": type_, "rank": self.rank, **fields}, allow_nan=False).encode()
        except ValueError:  # NaN or infinity: not JSON
            self.dropped += 1
            return False
        # The receiver's queue holds only net.unix.max_dgram_qlen datagrams (10 by default): a
        # step report it has no room for is dropped (the next one carries the same progress), the
        # others (hello, checkpoint, done, error) wait for room, up to 1 s.
        deadline = time.monotonic() + (0 if type_ == "step" else 1.0)
        while True:
            try:
                self._sock.sendto(data, self.socket_path)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.001)
            except OSError:
                break
        self.dropped += 1
        return False

    def hello(self, step):
        return self.report("hello", pid=os.getpid(), step=int(step), attempt=self.attempt)

    def step(self, step, loss, start_s, duration_s, ops=()):
        loss = float(loss)
        return self.report("step", step=int(step), loss=loss if math.isfinite(loss) else None, start_s=float(start_s),
                           duration_s=float(duration_s),
                           ops=[{"optype": o["optype"], "start_s": o["start_s"], "duration_s": o["duration_s"],
                                 **({"mb_id": o["mb_id"]} if o.get("mb_id", -1) >= 0 else {})} for o in ops])

    def checkpoint(self, step, path, nbytes, seconds):
        return self.report("checkpoint", step=int(step), path=str(path), bytes=int(nbytes), seconds=float(seconds))

    def error(self, step, kind, message):
        if kind not in ("user", "nan", "internal"):
            raise ValueError(f"error kind {kind!r} is not user, nan or internal")
        return self.report("error", step=int(step), kind=kind, message=str(message)[:4096])

    def done(self, step):
        return self.report("done", step=int(step))

    def timer_sink(self, loss_of=None):
        """A StepTimer sink that sends each step's report; loss_of() gives
        the step's loss (NaN when not given)."""
        def sink(step, ops, start_s, duration_s):
            self.step(step, loss_of() if loss_of else float("nan"), start_s, duration_s, ops)
        return sink

    # ---- commands --------------------------------------------------------
    def commands(self):
        """The complete command lines appended since the last call that
        concern this rank, as dicts. A line without its final newline waits
        for the next call; a line that is not a JSON object with a command
        goes to bad_commands."""
        if not self.control_path:
            return []
        try:
            with open(self.control_path, "rb") as f:
                f.seek(self._control_offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._control_offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_COMMAND_LINE:
            self.bad_commands.append((self._partial[:80].decode("utf-8", "replace"),
                                      f"a line longer than {MAX_COMMAND_LINE} bytes"))
            self._partial = b""
        out = []
        for raw in lines:
            if not raw.strip():
                continue
            try:
                cmd = json.loads(raw)
                if not isinstance(cmd, dict) or not isinstance(cmd.get("command"), str):
                    raise ValueError("not an object with a string 'command'")
            except ValueError as e:
                self.bad_commands.append((raw[:200].decode("utf-8", "replace"), str(e)))
                continue
            target = cmd.get("rank", -1)
            if target is None or target == -1 or target == self.rank:
                out.append(cmd)
        return out

    def deliver_commands(self, actions):
        """Read the new commands and queue each in an Actions as an action
        of the same name (checkpoint_now, stop, skip, slow), its other fields
        as args."""
        cmds = self.commands()
        for cmd in cmds:
            args = {k: v for k, v in cmd.items() if k not in ("command", "rank")}
            actions.deliver(events.Action(cmd["command"], None, "job channel", args, "executor"))
        return cmds

    # ---- checkpoints -----------------------------------------------------
    def checkpoint_path(self, step, suffix):
        if not self.checkpoint_dir:
            raise ValueError("no checkpoint folder: BALLAST_CHECKPOINT_DIR is not set")
        return os.path.join(self.checkpoint_dir, f"step-{int(step):08d}.{suffix}")

    def latest_checkpoint(self, at_or_before=None):
        """The newest complete step-NNNNNNNN.* in the checkpoint folder (at or
        before a step when given), or None."""
        if not self.checkpoint_dir or not os.path.isdir(self.checkpoint_dir):
            return None
        best = None
        for name in os.listdir(self.checkpoint_dir):
            m = _CHECKPOINT.match(name)
            if not m:
                continue
            step = int(m.group(1))
            if at_or_before is not None and step > at_or_before:
                continue
            if best is None or step > best[0]:
                best = (step, os.path.join(self.checkpoint_dir, name))
        return best[1] if best else None


def ops_of_step_report(report):
    """The step.timing rows (ballast.events.op_timing) of a `step` report as
    the executor receives it: the report's rank and step, one row per op,
    seq_id counting the ops of each type in the step, plain data
    parallelism (dp_rank = rank, stage 0)."""
    rank, step, seen, rows = int(report["rank"]), int(report["step"]), {}, []
    for op in report.get("ops") or []:
        seq = seen.get(op["optype"], 0)
        seen[op["optype"]] = seq + 1
        rows.append(events.op_timing(rank, step, op["optype"], op["start_s"], op["duration_s"], seq_id=seq,
                                     mb_id=op.get("mb_id", -1)))
    return rows


def parse_inject(text):
    """BALLAST_INJECT ("nan@12,usererror@30") as {kind: [steps]}; a part
    that is not KIND@STEP raises ValueError naming it."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, at, step = part.partition("@")
        if not at or not kind or not step.isdigit():
            raise ValueError(f"BALLAST_INJECT: '{part}' is not KIND@STEP")
        out.setdefault(kind, []).append(int(step))
    return out


def write_atomically(path, write):
    """Write a file complete or not at all: write(f) into a temporary file in
    the same folder, fsync, rename to path, fsync the folder. Returns the
    bytes written and the seconds it took."""
    t0 = time.perf_counter()
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            nbytes = f.tell()
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return nbytes, time.perf_counter() - t0
