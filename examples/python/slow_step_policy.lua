-- A policy for examples/python/train.py: keeps a moving average of step
-- times and asks for a checkpoint, then a pause, when steps slow down.
local avg, n, warned = 0, 0, false

ballast.on("step.timing", function(ev)
  for _, op in ipairs(ev.payload.ops) do
    local d = op.duration_s
    if n >= 5 and d > 2.5 * avg then
      if not warned then
        warned = true
        return { action = "checkpoint_now", reason = string.format("step %d took %.1fx the average", op.step, d / avg) }
      end
      return { action = "pause", reason = string.format("step %d still slow (%.1f ms)", op.step, d * 1000) }
    end
    n = n + 1
    avg = avg + (d - avg) / n
  end
end)
