-- Ballast's default recovery policy: ByteRobust's ladder.
--
-- The aim is the job's effective training time (ETTR): act at once and
-- precisely on faults whose cause is known, save work before a likely
-- failure, restart what has no known cause, and stop for a person when
-- restarting does not help or the fault is the user's. Each handler returns
-- recovery actions ({action=, subject=, reason=, args=}, the fields of
-- ballast_recovery_action in abi/ballast/events.h); the host publishes them
-- as recovery.action for the executor (plugins/scheduler/runner) to carry out.
-- A subject "rank:N" means the node that runs rank N; a host name means that
-- node; none means the job.
--
-- The ladder, by the event that reports the fault:
--
-- 1. Explicit machine fault: fault.confirmed naming a machine (not "rank:N"),
--    from the machine detector (kind "outlier") or an inspection (the
--    InfiniteHBD trace's hardware, software, stress-test, offline and
--    maintenance faults): evict the machine and replace it with a standby,
--    at once. A machine fault of kind "unknown" has no known cause: rung 6.
--    So is a machine the machine detector finds with network errors of its
--    own (fault.suspected, kind "outlier", confidence at least
--    NETWORK_CONFIDENCE, metric TCP retransmits, drops, errors or carrier
--    changes): its link or NIC loses packets (the peers of a lock-step job
--    only wait on it, they do not retransmit), and the straggler analysis
--    cannot name it (every rank's all-reduce is slow alike). A checkpoint
--    first (outside the cooldown), then evict and replace.
-- 2. Hang: fault.confirmed from detector "hang" (kinds "not_joined",
--    "stuck", "mismatch", ...; the evidence is the root-cause verdict, one
--    event per cause). A verdict with one cause names the rank: isolate its
--    node (evict + replace "rank:N"). A verdict with several causes, or a
--    link between two ranks, is uncertain: over-evict the group it names
--    (every cause rank and both ends of a link), one evict + replace each.
--    A verdict is acted on once, whichever of its events comes first; one
--    that names a rank (of any cause) the executor reported dead, NaN or
--    failed in the last HANG_AFTER_EXIT_S is that fault seen in the rings:
--    no action; one whose causes are all processes that are gone (kind
--    "crashed") is a crash: rung 6.
-- 3. Fail-slow: straggler.report of kind "worker". The rank that the
--    analysis blames most, summed over STRAGGLER_REPORTS reports in a row of
--    at least STRAGGLER_SLOWDOWN, is evicted and replaced. A report under the
--    threshold or of another kind ends the run of reports; a "stage" or
--    "random" slowdown has no machine to remove and is only logged; a worker
--    slowdown blamed on no rank goes to a person.
-- 4. NaN: fault.confirmed of kind "nan" (the executor, from the trainer's
--    error report; evidence {step=S, message=...}): roll back to the
--    checkpoint before step S, {action="rollback", args={before_step=S}}.
--    A second NaN at or before the step of the last one is not transient
--    (data or code): escalate.
-- 5. User-code error: fault.confirmed of kind "user_error" (evidence
--    {step=S, message=...}): no eviction, no restart: escalate (the job
--    stops for a person) with the trainer's message.
-- 6. Everything else (a crashed rank, kind "crashed" from detector
--    "executor", an unknown machine fault, any other kind): restart the job
--    from its last checkpoint; after RESTART_LIMIT restarts within
--    RESTART_WINDOW_S, escalate instead (faults within
--    RESTART_SAME_INCIDENT_S of a counted restart count with it).
--
-- Beside the ladder: a confident fault.suspected asks for a checkpoint (at
-- most once per CHECKPOINT_COOLDOWN_S), and node.silent pauses the job and
-- escalates.
--
-- Events from the executor (plugins/scheduler/runner): a rank that exited
-- is fault.confirmed {subject="rank:N", rank=N, kind="crashed" | "nan" |
-- "user_error", metric="process.exit", detector="executor", evidence={pid,
-- how, attempt, step, message, error_kind}}; step is the step the error
-- happened in. Windows are counted in the events' own time (ev.ts), so a
-- replay (ballast policy check) decides as the live run would.

-- fault.suspected at or above this confidence triggers a checkpoint.
local CHECKPOINT_CONFIDENCE = 0.9
-- A machine detector's network-error outlier at or above this confidence is
-- rung 1: 0.5 is its own alert threshold (z 4, confidence = z / 8), and its
-- minimum deviation for these metrics (20 per second) keeps noise out.
local NETWORK_CONFIDENCE = 0.5
-- Checkpoints cost minutes of I/O: at most one per this many seconds, even
-- when several detectors suspect several machines at once.
local CHECKPOINT_COOLDOWN_S = 600
-- straggler.report: a slowdown (actual / ideal step time) worth losing a
-- machine for, when the same analysis says so this many times in a row.
local STRAGGLER_SLOWDOWN = 1.25
local STRAGGLER_REPORTS = 3
-- Restarts without a known cause: this many within the window escalate.
local RESTART_LIMIT = 3
local RESTART_WINDOW_S = 1800
-- Restarts this close to the last counted one are counted with it.
local RESTART_SAME_INCIDENT_S = 10
-- A hang verdict this soon after the executor saw the rank end is that end.
local HANG_AFTER_EXIT_S = 60

local last_checkpoint = -math.huge
local restarts = {}         -- event times of the restarts within the window
local slow_reports = {}     -- the current run of worker straggler reports: {rank -> blame}
local hang_verdicts = {}    -- "communicator/seq" of verdicts acted on
local rank_ended = {}       -- rank -> event time the executor reported it ended
local last_nan_step = nil

local function rank_subject(subject)
  return type(subject) == "string" and subject:match("^rank:%d+$") ~= nil
end

local function event_time(ev)
  return ev.ts or ballast.now()
end

local function evict_and_replace(subject, why, args)
  return {action = "evict", subject = subject, reason = why, args = args},
         {action = "replace", subject = subject, reason = why, args = {count = 1}}
end

-- Rung 6: restart, unless restarts keep coming.
local function restart_or_escalate(ev, subject, why)
  local now = event_time(ev)
  local kept = {}
  for _, t in ipairs(restarts) do
    if now - t < RESTART_WINDOW_S then kept[#kept + 1] = t end
  end
  restarts = kept
  local last = restarts[#restarts]
  if last and now - last < RESTART_SAME_INCIDENT_S then
    -- Faults reported together (several nodes of one outage) are one
    -- incident: restart again, but count it once.
    return {action = "restart", subject = subject, reason = why}
  end
  if #restarts >= RESTART_LIMIT then
    return {action = "escalate", subject = subject,
            reason = string.format("%s: %d restarts within %d s did not help", why, #restarts, RESTART_WINDOW_S)}
  end
  restarts[#restarts + 1] = now
  return {action = "restart", subject = subject, reason = why}
end

-- Rung 2: a root-cause verdict of the hang detector.
local function on_hang(ev, f, why)
  local verdict = type(f.evidence) == "table" and f.evidence or {}
  local key = tostring(verdict.communicator) .. "/" .. tostring(verdict.seq)
  if verdict.communicator ~= nil and hang_verdicts[key] then
    return nil  -- another cause of a verdict already acted on
  end
  local causes = type(verdict.root_cause) == "table" and verdict.root_cause or {}
  -- Any rank of the verdict that the executor saw end: the verdict is that
  -- exit seen in the rings, whichever of its events comes first.
  local ranks = {f.rank}
  for _, c in ipairs(causes) do ranks[#ranks + 1] = c.rank end
  for _, r in ipairs(ranks) do
    local ended = type(r) == "number" and rank_ended[r]
    if ended and event_time(ev) - ended < HANG_AFTER_EXIT_S then
      if verdict.communicator ~= nil then hang_verdicts[key] = true end
      ballast.log("info", string.format("hang verdict naming rank %d: the rank already ended; its exit is being handled", r))
      return nil
    end
  end
  if verdict.communicator ~= nil then hang_verdicts[key] = true end
  -- Causes whose processes are all gone are crashes seen from the rings,
  -- reported before the executor's: not the machines' fault (rung 6).
  local gone = #causes > 0
  for _, c in ipairs(causes) do
    gone = gone and (c.kind == "crashed" or (type(c.evidence) == "string" and c.evidence:find("is gone", 1, true) ~= nil))
  end
  if gone then
    return restart_or_escalate(ev, f.subject, why .. ": the process is gone")
  end
  -- The group the verdict names: each cause's rank, and both ends of a link.
  local group, seen = {}, {}
  local function add(r)
    if type(r) == "number" and not seen[r] then
      seen[r] = true
      group[#group + 1] = r
    end
  end
  for _, c in ipairs(causes) do
    add(c.rank)
    if type(c.link) == "table" then add(c.link[1]); add(c.link[2]) end
  end
  if #group == 0 then add(f.rank) end
  if #group == 0 then
    return restart_or_escalate(ev, f.subject, why .. " naming no rank")
  end
  table.sort(group)
  local out = {}
  local certain = #group == 1
  for _, r in ipairs(group) do
    local subject = "rank:" .. r
    local reason = certain and string.format("%s: isolating the node of rank %d", why, r)
                   or string.format("%s: uncertain verdict, over-evicting the group of ranks %s",
                                    why, table.concat(group, ","))
    local evict, replace = evict_and_replace(subject, reason, {hang = true, certain = certain})
    out[#out + 1] = evict
    out[#out + 1] = replace
  end
  return out
end

ballast.on("fault.confirmed", function(ev)
  local f = ev.payload or {}
  local kind = f.kind or "unknown"
  local evidence = type(f.evidence) == "table" and f.evidence or {}
  local why = string.format("%s fault confirmed by %s (%s)", kind, f.detector or "a detector",
                            f.metric or "no metric")
  if not f.subject then
    return {action = "escalate", reason = why .. " with no subject"}
  end

  if f.detector == "executor" and f.rank then rank_ended[f.rank] = event_time(ev) end

  if kind == "user_error" then  -- rung 5
    return {action = "escalate", subject = f.subject,
            reason = string.format("user-code error at step %s on %s: %s", tostring(evidence.step or "?"),
                                   f.subject, tostring(evidence.message or "no message"))}
  end

  if kind == "nan" then  -- rung 4
    local step = tonumber(evidence.step)
    if step and last_nan_step and step <= last_nan_step then
      return {action = "escalate", subject = f.subject,
              reason = string.format("NaN loss again at step %d after rolling back from step %d: data or code, not a transient",
                                     step, last_nan_step)}
    end
    last_nan_step = step or last_nan_step
    return {action = "rollback", subject = nil,
            reason = string.format("NaN loss at step %s on %s", tostring(step or "?"), f.subject),
            args = step and {before_step = step} or nil}
  end

  if f.detector == "hang" then  -- rung 2
    return on_hang(ev, f, why)
  end

  if not rank_subject(f.subject) and kind ~= "unknown" then  -- rung 1
    local evict, replace = evict_and_replace(f.subject, why)
    return {evict, replace}
  end

  return restart_or_escalate(ev, f.subject, why)  -- rung 6
end)

-- Whether a machine detector's metric counts network errors of the machine
-- itself (rung 1): not its throughput, which every machine of a lock-step
-- job loses together.
local function network_error_metric(metric)
  if type(metric) ~= "string" then return false end
  return metric == "net.tcp.retrans" or metric:match("^net%..+_drops$") ~= nil or
         metric:match("^net%..+_errors$") ~= nil or metric:match("^net%..+%.carrier_changes$") ~= nil
end

-- A suspected fault is not acted on directly (false positives would evict
-- healthy machines), but a confident one means a failure is likely soon:
-- checkpoint now so that the restart loses as little work as possible.
-- Network errors of one machine, as the machine detector names them, are
-- rung 1 (see the top).
ballast.on("fault.suspected", function(ev)
  local f = ev.payload or {}
  local network = f.detector == "machine" and f.kind == "outlier" and type(f.subject) == "string" and
                  not rank_subject(f.subject) and network_error_metric(f.metric)
  if (f.confidence or 0) < (network and NETWORK_CONFIDENCE or CHECKPOINT_CONFIDENCE) then return nil end
  local why = string.format("%s suspected on %s with confidence %.2f", f.kind or "fault",
                            tostring(f.subject), f.confidence)
  local out = {}
  local now = ballast.now()
  if now - last_checkpoint < CHECKPOINT_COOLDOWN_S then
    ballast.log("info", "checkpoint already taken recently; not repeating for " .. tostring(f.subject))
  else
    last_checkpoint = now
    out[#out + 1] = {action = "checkpoint_now", reason = why}
  end
  if network then
    local evict, replace = evict_and_replace(f.subject, string.format("%s: network errors (%s) of its own",
                                                                      why, f.metric))
    out[#out + 1] = evict
    out[#out + 1] = replace
  end
  if #out == 0 then return nil end
  return out
end)

-- Rung 3: fail-slow. One report can be noise (a slow step, a checkpoint);
-- the same analysis blaming a worker several times in a row is a machine
-- that slows every step.
ballast.on("straggler.report", function(ev)
  local r = ev.payload or {}
  local slowdown = r.slowdown or 1
  if r.kind ~= "worker" or slowdown < STRAGGLER_SLOWDOWN then
    slow_reports = {}
    if slowdown >= STRAGGLER_SLOWDOWN then
      ballast.log("warn", string.format("job %.2fx slower (%s stragglers): no single worker to evict",
                                        slowdown, tostring(r.kind)))
    end
    return nil
  end
  -- The worst rank the analysis names. A stage, DP rank or op type may come
  -- before it (culprits are sorted by slowdown, and with one pipeline stage
  -- that stage explains all of it), but a "worker" report's own verdict is
  -- its slowest ranks; without one, someone has to look.
  local culprit = nil
  for _, c in ipairs(r.culprits or {}) do
    if c.dimension == "rank" then culprit = c; break end
  end
  if not culprit then
    slow_reports = {}
    local first = (r.culprits or {})[1]
    return {action = "escalate",
            reason = first and string.format("worker straggler blamed on %s=%s (%.2fx), no rank named",
                                             first.dimension, first.name, slowdown)
                     or string.format("worker straggler (%.2fx) without a culprit", slowdown)}
  end
  local blame = {}
  for _, c in ipairs(r.culprits) do
    if c.dimension == "rank" then blame[c.name] = (blame[c.name] or 0) + (c.slowdown or 0) end
  end
  slow_reports[#slow_reports + 1] = blame
  if #slow_reports < STRAGGLER_REPORTS then
    ballast.log("info", string.format("worker straggler %.2fx, rank %s blamed (%d of %d reports)", slowdown,
                                      culprit.name, #slow_reports, STRAGGLER_REPORTS))
    return nil
  end
  local total = {}
  for _, b in ipairs(slow_reports) do
    for rank, s in pairs(b) do total[rank] = (total[rank] or 0) + s end
  end
  local worst, most = nil, -math.huge
  for rank, s in pairs(total) do
    if s > most or (s == most and tonumber(rank) < tonumber(worst)) then worst, most = rank, s end
  end
  slow_reports = {}
  local subject = "rank:" .. worst
  local why = string.format("straggler rank %s blamed for %.2fx over %d reports (job %.2fx slower)", worst,
                            most / STRAGGLER_REPORTS, STRAGGLER_REPORTS, slowdown)
  local evict, replace = evict_and_replace(subject, why, {slowdown = slowdown})
  return {evict, replace}
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
