// bench_ettr: the effective training time ratio (ETTR: time in training
// steps that were kept / wall time) of a job the size of the InfiniteHBD
// cluster (400 nodes) over the trace's 348 days of faults, every fault
// hitting the job. The default policy (scripts/default.lua, the real Lua
// engine) chooses each recovery from the fault.confirmed the fault becomes
// (fault_trace.hpp); the costs of detection, decision, restart and start-up
// are inputs, with defaults measured here (docs/benchmarks.md, "ettr").
//
// Cases: Ballast with warm standbys and start-up prefetch, with either, with
// neither, and the baseline that requeues the job cold (it notices a fault
// when the job dies or its collective watchdog fires, waits in the queue,
// starts every node cold). A fault while the job is down joins that outage.
// Checkpoints every --checkpoint-interval-s of training; a fault loses the
// work since the last one. Evicted nodes come back as spares when the trace
// says their fault ended; a job with no spare left waits for the next one.
#include "command_line.hpp"
#include "fault_trace.hpp"

#include "error.hpp"
#include "policy.hpp"

#include <ballast/events.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using ballast::faults::Fault;

struct Costs {
  double checkpoint_interval_s = 600;
  double detect_machine_s = 2.6;   // bench_detect: faulty machine named, mean of run 4
  double detect_other_s = 10.2;    // bench_hang: a stopped rank named at the 10 s stall threshold
  double decide_s = 0.001;         // policy (bench_policy ~1 us) and placement (bench_sched, ms)
  double restart_s = 1.5;          // ballast-trainer, 4 ranks, launch to first step from a checkpoint
  double start_plain_s = 9.25;     // bench_startup: a node's cold start, plain
  double start_prefetch_s = 2.75;  // bench_startup: the same with Ballast's start-up techniques
  double human_s = 1800;           // an escalation until a person restarts the job
  double watchdog_s = 600;         // baseline: PyTorch's collective watchdog (10 min)
  double hang_share = 0.5;         // baseline: faults that hang the job rather than end it
  double crash_detect_s = 5;       // baseline: torchrun's monitor interval
  double queue_s = 120;            // baseline: Slurm's BeginTime after a requeue
};

enum class Recovery { replace, restart, escalate };

// What the policy chose for each fault.
struct Decided {
  Recovery recovery = Recovery::restart;
  std::string action;  // the first action, as the policy named it
};

struct Sink : ballast::PolicySink {
  std::vector<ballast::PolicyAction> actions;
  std::vector<std::string> errors;
  void on_action(const ballast::PolicyAction& a) override { actions.push_back(a); }
  void on_publish(ballast::OwnedEvent) override {}
  void on_log(int, const std::string&) override {}
  void on_error(const std::string& m) override { errors.push_back(m); }
};

std::vector<Decided> decide(const std::vector<Fault>& faults, const std::string& script) {
  std::unique_ptr<ballast::Policy> policy;
  if (ballast::Policy::load(script, {}, &policy) != BALLAST_OK)
    throw std::runtime_error(std::string("policy: ") + ballast::last_error());
  std::vector<Decided> out;
  for (const auto& f : faults) {
    const std::string metric = f.cls + ": " + f.desc;
    ballast_fault_report r{};
    r.size = sizeof r;
    r.stage = BALLAST_FAULT_CONFIRMED;
    r.subject = f.node.c_str();
    r.rank = -1;
    r.kind = f.kind.c_str();
    r.metric = metric.c_str();
    r.confidence = 1.0;
    r.detector = "inspection";
    ballast_event e{};
    e.size = sizeof e;
    e.schema = BALLAST_SCHEMA_FAULT_REPORT;
    e.topic = "fault.confirmed";
    e.ts_ns = int64_t((ballast::faults::kEpoch + f.start_days * 86400.0) * 1e9);
    e.source.node = f.node.c_str();
    e.source.rank = -1;
    e.source.plugin = "inspection";
    e.payload = &r;
    e.payload_size = sizeof r;
    Sink sink;
    policy->handle(e, sink);
    if (!sink.errors.empty()) throw std::runtime_error("policy failed on " + f.node + ": " + sink.errors[0]);
    if (sink.actions.empty()) throw std::runtime_error("policy chose nothing for " + f.node + " (" + f.kind + ")");
    Decided d;
    d.action = sink.actions[0].action;
    d.recovery = d.action == "evict" || d.action == "replace" ? Recovery::replace
                 : d.action == "escalate"                     ? Recovery::escalate
                                                              : Recovery::restart;
    out.push_back(d);
  }
  return out;
}

// Nodes under a fault at once, sampled every hour: ByteRobust sizes its
// warm standbys by a percentile of it.
int concurrent_percentile(const std::vector<Fault>& faults, double days, double pct) {
  std::vector<int> counts;
  for (double t = 0; t <= days; t += 1.0 / 24) {
    std::map<std::string, bool> down;
    for (const auto& f : faults)
      if (f.start_days <= t && t < f.end_days) down[f.node] = true;
    counts.push_back(int(down.size()));
  }
  std::sort(counts.begin(), counts.end());
  return counts[std::min(counts.size() - 1, size_t(pct * double(counts.size())))];
}

struct Variant {
  std::string name;
  bool ballast, standbys_warm, prefetch;
};

struct Outcome {
  double wall_s = 0, down_s = 0, lost_s = 0;
  int waited_for_repair = 0, escalations = 0;
  double ettr() const { return (wall_s - down_s - lost_s) / wall_s; }
};

Outcome simulate(const std::vector<Fault>& faults, const std::vector<Decided>& decided, const Variant& v,
                 const Costs& c, double scale, int spares, double wall_s) {
  Outcome o;
  o.wall_s = wall_s;
  std::vector<double> pool(size_t(spares), 0.0);  // when each spare node is usable
  double up_at = 0;                               // the job trains from here (until the next fault)
  double down_from = 0;                           // start of the outage in progress
  bool down = false;
  const double restart = c.restart_s * scale;
  const double cold = (v.prefetch ? c.start_prefetch_s : c.start_plain_s) * scale;
  for (size_t i = 0; i < faults.size(); ++i) {
    const Fault& f = faults[i];
    const double t = f.start_days * 86400.0;
    if (down && t >= up_at) {  // the last outage ended before this fault
      o.down_s += up_at - down_from;
      down = false;
    }
    if (!down) {
      const double trained = t - up_at;
      o.lost_s += std::fmod(trained, c.checkpoint_interval_s);  // since the last checkpoint
      down = true;
      down_from = t;
    }
    const Recovery r = decided[i].recovery;
    double ready = 0;  // when the job can start again after this fault
    if (v.ballast) {
      const double detect = r == Recovery::replace ? c.detect_machine_s : c.detect_other_s;
      ready = t + detect + c.decide_s;
      if (r == Recovery::escalate) {
        ++o.escalations;
        ready += c.human_s + restart;
      } else if (r == Recovery::restart) {
        ready += restart;
      }
    } else {
      ready = t + c.hang_share * c.watchdog_s + (1 - c.hang_share) * c.crash_detect_s + c.queue_s;
    }
    const bool needs_node = v.ballast ? r == Recovery::replace : f.kind != "unknown";
    if (needs_node) {
      // The earliest usable spare takes the node's place; the node comes
      // back as a spare when its fault ends.
      auto best = std::min_element(pool.begin(), pool.end());
      if (best == pool.end()) throw std::runtime_error("no spare nodes: give --standbys at least 1");
      if (*best > ready) {
        ++o.waited_for_repair;
        ready = *best;
      }
      *best = std::max(f.end_days * 86400.0, ready);
      if (v.ballast) ready += v.standbys_warm ? restart : cold + restart;
    }
    if (!v.ballast) ready += c.start_plain_s * scale + restart;  // every node cold
    up_at = std::max(up_at, ready);
  }
  if (down) o.down_s += std::min(up_at, wall_s) - down_from;
  return o;
}

void line(const std::string& name, const char* metric, double value, const char* unit) {
  std::printf("{\"bench\":\"ettr\",\"case\":\"%s\",\"metric\":\"%s\",\"value\":%.6g,\"unit\":\"%s\"}\n", name.c_str(),
              metric, value, unit);
}

}  // namespace

int main(int argc, char** argv) {
  Costs c;
  std::string trace = std::string(BALLAST_SOURCE_DIR) + "/tests/data/faults/infinitehbd-fault-trace.json";
  std::string script = std::string(BALLAST_SOURCE_DIR) + "/scripts/default.lua";
  std::vector<double> scales = {1, 10, 60};
  int standbys = -1;
  CLI::App app{"ETTR of a job of the InfiniteHBD trace's size, Ballast against a cold requeue; JSON lines on stdout",
               "bench_ettr"};
  app.add_option("--trace", trace, "InfiniteHBD fault trace (JSON)");
  app.add_option("--policy", script, "recovery policy that chooses each recovery");
  app.add_option("--standbys", standbys, "spare nodes (default: the P99 of nodes under a fault at once, hourly)");
  app.add_option("--scales", scales, "start-up and restart costs multiplied by each (a larger job starts slower)");
  app.add_option("--checkpoint-interval-s", c.checkpoint_interval_s)->check(CLI::PositiveNumber);
  app.add_option("--detect-machine-s", c.detect_machine_s)->check(CLI::NonNegativeNumber);
  app.add_option("--detect-other-s", c.detect_other_s)->check(CLI::NonNegativeNumber);
  app.add_option("--decide-s", c.decide_s)->check(CLI::NonNegativeNumber);
  app.add_option("--restart-s", c.restart_s)->check(CLI::NonNegativeNumber);
  app.add_option("--start-plain-s", c.start_plain_s)->check(CLI::NonNegativeNumber);
  app.add_option("--start-prefetch-s", c.start_prefetch_s)->check(CLI::NonNegativeNumber);
  app.add_option("--human-s", c.human_s)->check(CLI::NonNegativeNumber);
  app.add_option("--watchdog-s", c.watchdog_s)->check(CLI::NonNegativeNumber);
  app.add_option("--hang-share", c.hang_share)->check(CLI::Range(0.0, 1.0));
  app.add_option("--crash-detect-s", c.crash_detect_s)->check(CLI::NonNegativeNumber);
  app.add_option("--queue-s", c.queue_s)->check(CLI::NonNegativeNumber);
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  try {
    const auto faults = ballast::faults::read_trace(trace);
    if (faults.empty()) throw std::runtime_error(trace + ": no faults");
    double last_days = 0;
    for (const auto& f : faults) last_days = std::max({last_days, f.start_days, f.end_days});
    const double wall_s = last_days * 86400.0;
    if (standbys < 0) standbys = std::max(1, concurrent_percentile(faults, last_days, 0.99));
    const auto decided = decide(faults, script);
    std::map<std::string, int> chosen;
    for (const auto& d : decided) chosen[d.action]++;
    line("trace", "faults", double(faults.size()), "count");
    line("trace", "days", last_days, "days");
    line("trace", "standbys", standbys, "nodes");
    for (const auto& [action, n] : chosen) line("policy/" + action, "faults", n, "count");
    const Variant variants[] = {{"ballast", true, true, true},
                                {"ballast_standbys_only", true, true, false},
                                {"ballast_prefetch_only", true, false, true},
                                {"ballast_neither", true, false, false},
                                {"requeue_cold", false, false, false}};
    for (double scale : scales) {
      char tag[32];
      std::snprintf(tag, sizeof tag, "/startup_x%g", scale);
      double base_loss = 0;
      for (const auto& v : variants)
        if (!v.ballast) base_loss = 1 - simulate(faults, decided, v, c, scale, standbys, wall_s).ettr();
      for (const auto& v : variants) {
        const Outcome o = simulate(faults, decided, v, c, scale, standbys, wall_s);
        const std::string name = v.name + tag;
        line(name, "ettr", o.ettr(), "ratio");
        line(name, "down", o.down_s / 3600, "h");
        line(name, "lost_work", o.lost_s / 3600, "h");
        line(name, "waited_for_repair", o.waited_for_repair, "count");
        if (v.ballast) line(name, "lost_time_vs_requeue_cold", (1 - o.ettr()) / base_loss, "ratio");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ettr: %s\n", e.what());
    return 1;
  }
  return 0;
}
