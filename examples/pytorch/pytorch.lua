-- examples/pytorch/train.py supervised by `ballast run`: 3 data-parallel
-- ranks (gloo on the CPU), the executor, the hang detector (the ranks write
-- no trace ring: it watches their heartbeats), the online straggler
-- analysis and the default policy. Try a crash and a hang:
--
--   build/bin/ballast run examples/pytorch/pytorch.lua \
--       --inject crash:rank=1@step40 --inject hang:rank=2@step90
--
-- Each is detected, the job restarted from its newest checkpoint
-- (step-NNNNNNNN.safetensors) and trained to the end.
return {
  plugins = {
    "runner",  -- first: it sets BALLAST_TRACE_DIR for the hang detector
    { path = "hang", config = { stall_seconds = 4, period_seconds = 0.25 } },
    { path = "straggler", config = { window_steps = 20, report_every = 20 } },
    "scheduler",
  },
  job = {
    command = { "./train.py", "--steps", "150", "--checkpoint-every", "20" },
    ranks = 3,
    standby = 1,
    steps = 150,
    -- importing torch takes seconds per rank on a small machine
    hello_timeout_seconds = 120,
  },
  policy = { script = "default.lua", fallback = "escalate" },
}
