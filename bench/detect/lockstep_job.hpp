// A generated lock-step data-parallel job: its shared timeline (steps of
// compute then communication, checkpoints, job-wide slowdowns and pauses),
// one planted fault, and the metrics each machine's exporters would serve,
// sampled once a second with jitter and loss. See lockstep_job.cpp for the
// model and its figures.
#pragma once

#include "metrics_csv.hpp"

#include <ballast/events.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace bench_lockstep {

enum class Fault {
  none,
  slow_gpu,
  nic_flapping,
  pfc_storm,
  memory_leak,
  cpu_contention,
  gpu_power_cap,
  degraded_network,
  // Faults each detector sees only in part (partial_faults()):
  hang_outside,  // a rank stops before the all-reduce: the job hangs, its GPU idles
  hang_inside,   // a rank stops inside the all-reduce: the job hangs, every GPU alike
  slow_input,    // a rank's input pipeline is late: its forward waits, little else shows
  gpu_xid        // a GPU reports an XID error (a row remapped): no effect on the steps
};
const char* fault_name(Fault f);
const std::vector<Fault>& all_faults();      // the seven faults of issue 27's item 3
const std::vector<Fault>& partial_faults();  // hang_outside, hang_inside, slow_input, gpu_xid
bool is_hang(Fault f);

struct Scenario {
  int index = 0;
  Fault fault = Fault::none;
  int machines = 8;
  int faulty = -1;  // machine index, -1 for none
  int faulty_gpu = 0;
  double onset_s = 0;  // absolute, same clock as the samples; 0 for none
  double seconds = 90;
  uint64_t seed = 0;
  bool extended = false;  // also export the GPUs' XID gauge (runs with the partial faults)
};

constexpr double kEpochS = 1800000000;  // the samples' clock at the job's second 0
std::string machine_name(int i);
Scenario make_scenario(int index, Fault f, double seconds, std::mt19937_64& rng);

// The samples of one scenario, in file order (per machine, time order).
// plain: gpu_util, net_tx_gbps, ... instead of the exporters' names.
ballast::machine::MetricsTable generate(const Scenario& sc, bool plain);

// One step of every rank's per-op timings, as a trainer's step timer sends
// them (step.timing): forward and backward compute, the gradients'
// all-reduce, the optimizer; rank = machine * 4 + GPU, one rank per DP rank.
struct StepTimings {
  double end_s = 0;  // when the step's last op ended (absolute, the samples' clock)
  std::vector<ballast_op_timing> ops;
  // The step the job hung in: its all-reduce never ends (duration NaN; the
  // rank that stopped outside it has none). Its ranks never report it.
  bool hung = false;
  int hung_rank = -1;  // the rank that stopped
  double stop_s = 0;   // when it stopped (absolute)
};
constexpr int kRanksPerMachine = 4;

// The steps of one scenario's job (the same timeline as generate()'s), in
// order, those that ran while it was sampled; a hung job's last is the one
// it hung in (hung = true).
std::vector<StepTimings> step_timings(const Scenario& sc);

}  // namespace bench_lockstep
