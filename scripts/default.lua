-- Ballast's default recovery policy.
--
-- The aim is to keep the job's effective training time high (ByteRobust's
-- ETTR): act quickly and precisely on confirmed faults, save work before a
-- likely failure, remove a machine that slows every step, and hand anything
-- ambiguous to an operator instead of guessing.
--
-- Each handler returns recovery actions ({action=, subject=, reason=,
-- args=}); the host publishes them as recovery.action events for the
-- scheduler and the launcher to carry out.

-- fault.suspected at or above this confidence triggers a checkpoint.
local CHECKPOINT_CONFIDENCE = 0.9
-- Checkpoints cost minutes of I/O: at most one per this many seconds, even
-- when several detectors suspect several machines at once.
local CHECKPOINT_COOLDOWN_S = 600
-- straggler.report: a single slow worker making steps this much slower
-- (actual / ideal step time) is worth losing a machine for.
local STRAGGLER_SLOWDOWN = 1.25

local last_checkpoint = -math.huge

-- A detector names a process as "rank:N" and a machine by its host name.
local function rank_subject(subject)
  return type(subject) == "string" and subject:match("^rank:%d+$") ~= nil
end

-- A confirmed fault: the evidence held long enough for the detector to be
-- sure. A process that crashed or hung on a healthy machine is restarted in
-- place (cheap, keeps the placement); a faulty machine is evicted and a
-- standby takes its place, so the job restarts on healthy hardware only.
ballast.on("fault.confirmed", function(ev)
  local f = ev.payload or {}
  local why = string.format("%s fault confirmed by %s (%s)", f.kind or "unknown",
                            f.detector or "a detector", f.metric or "no metric")
  if rank_subject(f.subject) then
    return {action = "restart", subject = f.subject, reason = why}
  end
  if not f.subject then
    return {action = "escalate", reason = why .. " with no subject"}
  end
  return {
    {action = "evict", subject = f.subject, reason = why},
    {action = "replace", subject = f.subject, reason = why, args = {count = 1}},
  }
end)

-- A suspected fault is not acted on directly (false positives would evict
-- healthy machines), but a confident one means a failure is likely soon:
-- checkpoint now so that the restart loses as little work as possible.
ballast.on("fault.suspected", function(ev)
  local f = ev.payload or {}
  if (f.confidence or 0) < CHECKPOINT_CONFIDENCE then return nil end
  local now = ballast.now()
  if now - last_checkpoint < CHECKPOINT_COOLDOWN_S then
    ballast.log("info", "checkpoint already taken recently; not repeating for " .. tostring(f.subject))
    return nil
  end
  last_checkpoint = now
  return {
    action = "checkpoint_now",
    reason = string.format("%s suspected on %s with confidence %.2f", f.kind or "fault",
                           tostring(f.subject), f.confidence),
  }
end)

-- A straggler report of kind "worker" blames one worker (the others wait for
-- it at every collective); evicting it removes the slowdown. Slowdowns of
-- kind "stage" or "random" come from the job's layout or from noise: no
-- machine to remove, so they are only logged.
ballast.on("straggler.report", function(ev)
  local r = ev.payload or {}
  local slowdown = r.slowdown or 1
  if r.kind ~= "worker" or slowdown < STRAGGLER_SLOWDOWN then
    if slowdown >= STRAGGLER_SLOWDOWN then
      ballast.log("warn", string.format("job %.2fx slower (%s stragglers): no single worker to evict",
                                        slowdown, tostring(r.kind)))
    end
    return nil
  end
  local culprit = (r.culprits or {})[1]
  if not culprit then
    return {action = "escalate", reason = string.format("worker straggler (%.2fx) without a culprit", slowdown)}
  end
  if culprit.dimension ~= "rank" then
    -- A slow stage or optype is not one machine: someone has to look.
    return {action = "escalate", reason = string.format("worker straggler blamed on %s=%s (%.2fx)",
                                                        culprit.dimension, culprit.name, slowdown)}
  end
  local subject = "rank:" .. culprit.name
  return {
    action = "evict",
    subject = subject,
    reason = string.format("straggler %s=%s slows the job %.2fx", culprit.dimension, culprit.name, slowdown),
    args = {slowdown = slowdown},
  }
end)

-- A silent node stopped reporting: it may be dead, or only its network or
-- agent. The job would hang at its next collective either way, so pause it
-- (no GPU hours burnt waiting) and escalate: telling a dead machine from a
-- partition needs a look the policy cannot take.
ballast.on("node.silent", function(ev)
  local f = ev.payload or {}
  local node = f.subject or ev.source.node
  local why = string.format("node %s silent", tostring(node))
  return {
    {action = "pause", reason = why},
    {action = "escalate", subject = node, reason = why},
  }
end)
