-- The default configuration of `ballast run`: the example plugin and the
-- default recovery policy. Paths are relative to this file, then to the
-- installed plugin and script folders.
return {
  role = "agent",
  plugins = {
    { path = "hello", config = { greeting = "hello from ballast", period_ms = 5000 } },
  },
  policy = { script = "default.lua", fallback = "escalate", deadline_ms = 100, memory_mb = 64 },
  bus = { dispatcher_threads = 1, queue_capacity = 4096 },
}
