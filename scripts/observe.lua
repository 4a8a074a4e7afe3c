-- Observe only: log what the default policy would look at, take no action.
--
-- For the first days beside a job, to see what the detectors report before
-- letting a policy act on it: `ballast policy check observe.lua --events ...`
-- or policy = { script = "observe.lua" } in the host's configuration.

local function describe(ev)
  local p = ev.payload
  if type(p) ~= "table" then return ev.topic end
  if ev.topic == "straggler.report" then
    return string.format("%s: %s stragglers, slowdown %.2fx", ev.topic, tostring(p.kind), p.slowdown or 0)
  end
  return string.format("%s: %s %s (confidence %.2f, by %s)", ev.topic, tostring(p.kind),
                       tostring(p.subject), p.confidence or 0, tostring(p.detector))
end

ballast.on("fault.*", function(ev) ballast.log("warn", describe(ev)) end)
ballast.on("node.silent", function(ev) ballast.log("warn", describe(ev)) end)
ballast.on("straggler.report", function(ev) ballast.log("info", describe(ev)) end)
