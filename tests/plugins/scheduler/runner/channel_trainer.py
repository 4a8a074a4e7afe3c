#!/usr/bin/python3
"""A minimal rank that speaks the job channel (docs/job-channel.md), for the
executor's tests: no model, each step sleeps. It says hello, reports steps,
writes checkpoints atomically every --checkpoint-every steps and on
checkpoint_now, obeys the control file, and injects the BALLAST_INJECT
faults nan@STEP and usererror@STEP. Rank 0 writes the checkpoints; every
rank resumes from BALLAST_RESUME_FROM. The "weights" are a number each step
updates deterministically, so a resumed run ends with the same value."""
import json, os, socket, sys, time

def arg(name, default):
    return type(default)(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default

steps = arg("--steps", 20)
step_s = arg("--step-seconds", 0.05)
every = arg("--checkpoint-every", 5)
exit_code_at = arg("--exit-at", -1)   # exit 3 at that step without an error report
# --exit-before-hello-on-restart: every attempt after the first exits 4 before its hello
linger_rank = arg("--linger-after-done", -1)  # that rank reports done, then never exits (a teardown hang)
rank = int(os.environ.get("RANK", "0"))
ckdir = os.environ.get("BALLAST_CHECKPOINT_DIR", ".")
sock_path = os.environ.get("BALLAST_JOB_SOCKET")
control = os.environ.get("BALLAST_CONTROL_FILE")
inject = [x for x in os.environ.get("BALLAST_INJECT", "").split(",") if x]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

def send(obj):
    if not sock_path:
        return
    try:
        sock.sendto(json.dumps(obj).encode(), sock_path)
    except OSError:
        pass

def save(step, w):
    path = os.path.join(ckdir, "step-%08d.safetensors" % step)
    tmp = path + ".tmp"
    t0 = time.time()
    with open(tmp, "w") as f:
        f.write(json.dumps({"step": step, "w": w}))
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    send({"type": "checkpoint", "rank": rank, "step": step, "path": path,
          "bytes": os.path.getsize(path), "seconds": time.time() - t0})

step, w = 0, 1.0
resume = os.environ.get("BALLAST_RESUME_FROM", "")
if resume:
    with open(resume) as f:
        d = json.load(f)
    step, w = d["step"], d["w"]
if "--exit-before-hello-on-restart" in sys.argv and int(os.environ.get("BALLAST_ATTEMPT", "0")) > 0:
    sys.exit(4)
send({"type": "hello", "rank": rank, "pid": os.getpid(), "step": step + 1,
      "attempt": int(os.environ.get("BALLAST_ATTEMPT", "0"))})
read_at, slow = 0, 1.0
while step < steps:
    if control:
        with open(control) as f:
            f.seek(read_at)
            data = f.read()
        upto = data.rfind("\n") + 1
        read_at += len(data[:upto].encode())
        for line in data[:upto].splitlines():
            c = json.loads(line)
            if c.get("rank", -1) not in (-1, rank):
                continue
            if c["command"] == "checkpoint_now" and rank == 0 and step > 0:
                save(step, w)
            elif c["command"] == "slow":
                slow = float(c["factor"])
            elif c["command"] == "stop":
                if rank == 0:
                    save(step, w)
                send({"type": "done", "rank": rank, "step": step})
                sys.exit(0)
    nxt = step + 1
    if "usererror@%d" % nxt in inject:
        send({"type": "error", "rank": rank, "step": nxt, "kind": "user",
              "message": "ValueError: bad batch at step %d" % nxt})
        sys.exit(1)
    if "nan@%d" % nxt in inject:
        send({"type": "error", "rank": rank, "step": nxt, "kind": "nan",
              "message": "loss is NaN at step %d" % nxt})
        sys.exit(1)
    if nxt == exit_code_at:
        sys.exit(3)
    t0 = time.time()
    time.sleep(step_s * slow)
    w = (w * 1.0001 + nxt * 1e-3) % 1000.0
    step = nxt
    dur = time.time() - t0
    send({"type": "step", "rank": rank, "step": step, "loss": 5.0 / (1 + step), "start_s": t0,
          "duration_s": dur, "ops": [{"optype": "forward-compute", "start_s": t0, "duration_s": dur / 2},
                                     {"optype": "backward-compute", "start_s": t0 + dur / 2, "duration_s": dur / 2}]})
    if rank == 0 and step % every == 0:
        save(step, w)
if rank == 0:
    with open(os.path.join(os.environ.get("BALLAST_JOB_DIR", "."), "final-weights.json"), "w") as f:
        json.dump({"step": step, "w": w}, f)
send({"type": "done", "rank": rank, "step": step})
while rank == linger_rank:
    time.sleep(60)
