#!/usr/bin/python3
"""A real PyTorch trainer supervised by Ballast: DistributedDataParallel on
the CPU with gloo, a small MLP fitting a fixed random teacher network (its
loss falls), atomic checkpoints (safetensors, as the executor reads them, or torch.save), and the `ballast` package for
step timings, the heartbeat and recovery actions.

Launch it with torchrun's environment variables, as `ballast launch` sets
them (Debian's torchrun entry point fails on its own Python):

    PYTHONPATH=python build/bin/ballast launch -n 3 --stall 5 -- \\
        /usr/bin/python3 examples/pytorch/train.py --steps 200

or under the executor (`ballast run`, docs/job-channel.md), which also gives
it BALLAST_JOB_SOCKET, BALLAST_CONTROL_FILE, BALLAST_CHECKPOINT_DIR and
BALLAST_RESUME_FROM. Faults to inject: --crash R@S (rank R kills itself at
step S), --hang R@S (rank R stops making progress at step S, sleeping),
--slow R@F (rank R computes F times slower), and BALLAST_INJECT's nan@S and
usererror@S."""
import argparse
import os
import signal
import sys
import time

try:
    import ballast
except ImportError:  # run from the source tree without PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import ballast
from ballast import job as job_channel


def rank_at(text, what):
    """'R@N' as (R, N)."""
    if text is None:
        return None
    r, at, n = text.partition("@")
    try:
        return int(r), float(n) if what == "factor" else int(n)
    except ValueError:
        raise SystemExit(f"train.py: {text!r} is not RANK@{what.upper()}")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="the step to finish at")
    ap.add_argument("--batch", type=int, default=64, help="samples per micro-batch per rank")
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--checkpoint-every", type=int, default=20)
    ap.add_argument("--checkpoint-dir", default=None, help="default: $BALLAST_CHECKPOINT_DIR, else none")
    ap.add_argument("--checkpoint-format", choices=("safetensors", "torch"), default="safetensors",
                    help="safetensors (the job channel's, which the executor resumes from) or torch.save's")
    ap.add_argument("--resume", default=None, help="a checkpoint, or 'latest' (default: $BALLAST_RESUME_FROM)")
    ap.add_argument("--step-sleep-ms", type=float, default=0.0, help="extra time per step (to watch it run)")
    ap.add_argument("--crash", default=None, metavar="R@S")
    ap.add_argument("--hang", default=None, metavar="R@S")
    ap.add_argument("--slow", default=None, metavar="R@F")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    args = ap.parse_args()
    args.crash, args.hang = rank_at(args.crash, "step"), rank_at(args.hang, "step")
    args.slow = rank_at(args.slow, "factor")
    return args


def save_safetensors(path, model, optimizer, meta, torch):
    """The model's tensors and SGD's momentum buffers, flat, with the step,
    seed and world size in the metadata: what the executor resumes from."""
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, st in optimizer.state_dict()["state"].items():
        if st.get("momentum_buffer") is not None:
            tensors[f"optimizer.{i}.momentum_buffer"] = st["momentum_buffer"]
    flat = {}
    for name, t in tensors.items():
        if t.dtype != torch.float32:
            raise SystemExit(f"train.py: {name} is {t.dtype}: this example saves float32 tensors only")
        flat[name] = ("F32", list(t.shape), t.detach().contiguous().numpy().tobytes())
    return ballast.checkpoint.save(path, flat, meta)


def load_checkpoint(path, model, optimizer, torch):
    """{model, optimizer, step, seed, world_size} from either format."""
    if not path.endswith(".safetensors"):
        return torch.load(path, map_location="cpu")
    tensors, meta = ballast.checkpoint.load(path)

    def tensor(name):
        _, shape, data = tensors[name]
        return torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(shape).clone()
    model_state = {k[len("model."):]: tensor(k) for k in tensors if k.startswith("model.")}
    opt_state = optimizer.state_dict()
    for k in tensors:
        if k.startswith("optimizer.") and k.endswith(".momentum_buffer"):
            opt_state["state"][int(k.split(".")[1])] = {"momentum_buffer": tensor(k)}
    return {"model": model_state, "optimizer": opt_state, "step": int(meta["step"]), "seed": int(meta["seed"]),
            "world_size": int(meta["world_size"])}


def main():
    args = parse_args()
    job = job_channel.Job()
    # The heartbeat first, before the slow import of torch: the launcher
    # knows at once that this job reports its progress.
    heartbeat = ballast.Heartbeat(rank=job.rank, world=job.world_size) if job.trace_dir else None
    try:
        return train(args, job, heartbeat)
    except BaseException:
        if heartbeat:
            heartbeat.close(done=False)  # state=failed: an error of its own
        raise


def train(args, job, heartbeat):
    rank, world = job.rank, job.world_size

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(args.seed)
    teacher = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    checkpoint_dir = args.checkpoint_dir or job.checkpoint_dir
    if checkpoint_dir:
        job.checkpoint_dir = checkpoint_dir
    resume = args.resume or job.resume_from
    if resume == "latest":
        resume = job.latest_checkpoint()
    first_step = 1
    if resume:
        state = load_checkpoint(resume, model, optimizer, torch)
        if state["world_size"] != world or state["seed"] != args.seed:
            raise SystemExit(f"train.py: {resume} was written by a job of {state['world_size']} ranks and seed "
                             f"{state['seed']}, this one has {world} and {args.seed}")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_step = state["step"] + 1
        if rank == 0:
            print(f"rank 0: resumed from {resume} at step {first_step}", flush=True)

    ddp = DDP(model)
    timer = ballast.StepTimer(rank=rank, heartbeat=heartbeat)
    loss_value = [float("nan")]
    if job.supervised:
        timer.sinks.append(job.timer_sink(lambda: loss_value[0]))

    def timed_allreduce(state, bucket):
        # The gradients are ready and go to the other ranks: the step's
        # communication phase, where a rank waits for the slowest.
        if timer.current_step is not None:
            timer.begin("separate-grads-all-reduce")
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, timed_allreduce)

    actions = ballast.Actions(rank=rank)
    want_checkpoint = []
    skip_next = []
    slow = [args.slow[1] if args.slow and args.slow[0] == rank else 1.0]
    actions.on("checkpoint_now", want_checkpoint.append)
    actions.on("skip", skip_next.append)
    actions.on("slow", lambda a: slow.__setitem__(0, float((a.args or {}).get("factor", 1.0))))

    def save(step):
        meta = {"step": step, "seed": args.seed, "world_size": world}
        if args.checkpoint_format == "torch":
            path = job.checkpoint_path(step, "pt")
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), **meta}
            nbytes, seconds = ballast.write_atomically(path, lambda f: torch.save(state, f))
        else:
            path = job.checkpoint_path(step, "safetensors")
            nbytes, seconds = save_safetensors(path, model, optimizer, meta, torch)
        job.checkpoint(step, path, nbytes, seconds)
        print(f"rank 0: checkpoint {path} ({nbytes} bytes, {seconds * 1000:.1f} ms)", flush=True)

    def batch(step, mb):
        g = torch.Generator().manual_seed(args.seed * 1000003 + step * 4099 + rank * 131 + mb)
        x = torch.randn(args.batch, 16, generator=g)
        with torch.no_grad():
            y = teacher(x)
        return x, y

    job.hello(first_step)
    first_loss = None
    step = first_step - 1
    for step in range(first_step, args.steps + 1):
        if args.crash and args.crash == (rank, step):
            print(f"rank {rank}: injected crash at step {step}, wall {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        with timer.step(step):
            total = 0.0
            for mb in range(args.micro_batches):
                last = mb == args.micro_batches - 1
                x, y = batch(step, mb)
                with timer.phase("forward-compute", mb_id=mb):
                    t0 = time.perf_counter()
                    loss = nn.functional.mse_loss(ddp(x), y)
                    if "nan" in job.inject and step in job.inject["nan"]:
                        loss = loss * float("nan")
                    if "usererror" in job.inject and step in job.inject["usererror"]:
                        job.error(step, "user", f"injected user error at step {step}")
                        raise RuntimeError(f"injected user error at step {step}")
                    if args.hang and args.hang == (rank, step):
                        print(f"rank {rank}: injected hang at step {step}, wall {time.time():.3f}", flush=True)
                        while True:
                            time.sleep(60)
                    if slow[0] > 1.0:
                        time.sleep((time.perf_counter() - t0) * (slow[0] - 1.0) + 0.002 * slow[0])
                timer.begin("backward-compute", mb_id=mb)
                no_sync = not last or skip_next
                if no_sync:
                    with ddp.no_sync():
                        (loss / args.micro_batches).backward()
                else:
                    (loss / args.micro_batches).backward()
                timer.end_phase()
                total += loss.item() / args.micro_batches
            loss_value[0] = total  # the step's report, sent as the step ends, carries it
            if skip_next:
                skip_next.clear()
            with timer.phase("optimizer"):
                if total != total:  # NaN
                    job.error(step, "nan", f"loss is NaN at step {step}")
                    raise SystemExit(f"rank {rank}: loss is NaN at step {step}")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if args.step_sleep_ms:
                time.sleep(args.step_sleep_ms / 1000)
        # The step's report went out with the step; now the step boundary.
        job.deliver_commands(actions)
        actions.poll()
        if first_loss is None:
            first_loss = total
        if rank == 0 and checkpoint_dir and (want_checkpoint or actions.stopping or
                                             (args.checkpoint_every and step % args.checkpoint_every == 0)):
            save(step)
        want_checkpoint.clear()
        if rank == 0 and (step % 50 == 0 or step == args.steps):
            print(f"rank 0: step {step} loss {total:.5f}", flush=True)
        if actions.stopping:
            break
    job.done(step)
    if heartbeat:
        heartbeat.close(done=True)
    print(f"rank {rank}: done at step {step}; loss {first_loss} -> {loss_value[0]}", flush=True)
    # PyTorch 1.13: dropping the DDP model joins gloo's worker threads while
    # holding the GIL, and a worker still releasing the comm hook's Python
    # callback waits for the GIL, so the rank never exits (seen on a loaded
    # machine). Training is over and reported: leave without the teardown.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
