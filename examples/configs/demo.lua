-- The demonstration `ballast run` runs by default: the bundled trainer
-- (examples/trainer, a character-level language model trained by 4
-- data-parallel ranks) supervised by the whole loop, with a small fault
-- schedule: a crash, a hang, a NaN loss and a machine that goes bad. Each
-- fault is detected, decided on by the default policy and recovered from
-- without a person; the summary at the end lists them with ETTR.
--
--   build/bin/ballast run examples/configs/demo.lua [--timeline run.json]
--
-- Your own job: replace `job.command` (and `ranks`), drop `inject`.
-- Paths are relative to this file, then to the installed plugin and script
-- folders.
return {
  plugins = {
    -- The executor, first: the hang detector finds the job's trace rings
    -- through the BALLAST_TRACE_DIR it sets.
    { path = "runner", config = {
        inject = { "crash:rank=1@step2000", "hang:rank=2@step4500", "nan@6500", "machine:node=3,kind=cpu@step8000" },
    } },
    { path = "collect", config = { period = 1 } },
    "machine",
    -- Only a clear slowdown: a busy small machine makes step times noisy.
    { path = "straggler", config = { window_steps = 50, report_every = 50, min_slowdown = 2 } },
    -- A hang is this job's collectives standing still for 1 s: its steps
    -- take a few ms, and its longest pause while healthy (a checkpoint, a
    -- busy machine) stays under 0.2 s.
    { path = "hang", config = { stall_seconds = 1, period_seconds = 0.25 } },
    "startup",
    "scheduler",
  },
  job = {
    command = { "ballast-trainer", "--steps", "10000", "--checkpoint-every", "20", "--log-every", "1000" },
    ranks = 4,
    standby = 1,
    steps = 10000,
  },
  policy = { script = "default.lua", fallback = "escalate", deadline_ms = 100, memory_mb = 64 },
  bus = { dispatcher_threads = 1, queue_capacity = 4096 },
}
