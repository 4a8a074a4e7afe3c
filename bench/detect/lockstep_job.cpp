// The model, per scenario (all times in seconds):
//
// - The job: `machines` (8, 16, 32 or 64) x 4 GPUs, in lock-step. A step is
//   3-8 s (drawn per job, +-3% per step): 70% compute, then 30%
//   communication (an all-reduce over the machines' NIC `ib0`). Every 25-40 s
//   a checkpoint of 4-8 s (GPUs idle, the disk written at ~2 GB/s, each
//   machine starting up to 0.5 s apart); in a run, with probability 0.6 a
//   job-wide slowdown of 10-20 s (steps 1.3-2x longer: a slow input
//   pipeline or shared storage) and with probability 0.4 a pause of 5-12 s
//   (every GPU idle). None of these is a fault.
// - The readings, per machine: GPU utilisation (compute ~95%, communication
//   ~60%: NCCL kernels spin, idle ~2%), power (650 / 350 / 110 W) and SM
//   clock (1980 MHz busy) per GPU; NIC bytes (20 GB/s each way while
//   communicating), carrier changes, receive errors, pause frames; CPU time
//   per CPU (user 25% compute, 10% otherwise), CPU and memory pressure,
//   available memory (400 GB +- 1% per machine), TCP retransmits (~1/s),
//   disk bytes written. Each machine has its own offset (+-2%) and noise.
// - Faults, on one machine from the onset to the end (the job slows for
//   every machine, since all wait on the slowest):
//   slow_gpu: one GPU at 60% of its clock, compute 1.6x longer;
//   nic_flapping: ib0 down 1-2 s of every 3-6 s (no traffic, a carrier
//     change each way, retransmits), communication 1.5x longer;
//   pfc_storm: the NIC sends pause frames (~50k/s), every link slows,
//     communication 3x longer;
//   memory_leak: the trainer leaks 2 GB/s of host memory; reclaim makes
//     memory pressure grow with what has leaked (leaked GB / 40, up to 0.6);
//   cpu_contention: a foreign process takes 45% of the CPUs (CPU pressure
//     0.3); the machine's input pipeline is late, its GPUs start each
//     compute 15% late and the step is 1.15x longer;
//   gpu_power_cap: one GPU capped at 60% power (390 W, clock 1500 MHz while
//     computing), compute 1.3x longer;
//   degraded_network: ib0 with bit errors (~200 receive errors/s, ~150
//     retransmits/s), communication 2.5x longer.
// - Faults each detector sees only in part (--set partial):
//   hang_outside: one rank's process stops (a deadlock in its own code)
//     after its compute, before the all-reduce of the first step after the
//     onset; every other rank enters it and waits for ever. While hung,
//     every GPU in the all-reduce runs NCCL's waiting kernel (util 100%,
//     200 W), the stopped rank's GPU idles; no traffic anywhere;
//   hang_inside: one rank's process stops 30% into that all-reduce: every
//     GPU shows the waiting kernel alike, no traffic (a job-wide change);
//   slow_input: one rank's input pipeline (CPU data loading) is late: its
//     forward waits for the batch, the job's compute phase is 1.25x longer;
//     its GPU idles at the start of compute where the others idle at the
//     end, and its machine's CPUs work 3% more;
//   gpu_xid: one GPU reports XID 63 (a memory row remapped after an ECC
//     error; DCGM's XID gauge, exported only in runs with these faults),
//     with no effect on the steps.
// - Sampling: every machine once a second, each sample 0-200 ms late (drawn
//   per sample), each series' sample lost with probability 1%.
// - Step timings (step_timings(), for the straggler analysis): each GPU is
//   one rank; per step its forward (1/3) and backward (2/3) compute, the
//   all-reduce from its compute's end to the communication's end, and a
//   20 ms optimizer. A healthy rank's compute ends 0-8% (drawn per rank and
//   step: sequence lengths differ) before the compute phase's end; the slow
//   or capped GPU's rank computes through the whole, longer, phase; under
//   CPU contention the machine's ranks start computing late (their input is
//   late) and end with the phase; under slow_input the late rank's forward
//   lasts from the phase's start (the trainer's timer counts the wait for
//   the batch in it). Network faults lengthen everyone's all-reduce alike; a
//   memory leak or ECC errors change no timing. A hung job's last step is
//   its hang: no rank finishes it.
#include "lockstep_job.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace bench_lockstep {

namespace {

constexpr int kGpus = 4;
constexpr int kCpus = 4;
constexpr double kT0 = kEpochS;
constexpr double kDt = 0.05;  // integration step of the counters

enum class Phase { compute, comm, idle, checkpoint, hang };

struct Segment {
  double start, end;
  Phase phase;
};

struct Window {
  double start, end, factor;
};

bool in(const Window& w, double t) { return t >= w.start && t < w.end; }

bool after_onset(const Scenario& sc, double t) { return sc.fault != Fault::none && t >= sc.onset_s - kT0; }

// The job's timeline, shared by every machine (lock-step).
struct Timeline {
  std::vector<Segment> segments;
  std::vector<double> ckpt_offset;  // per machine

  const Segment& at(double t) const {
    auto it =
        std::upper_bound(segments.begin(), segments.end(), t, [](double x, const Segment& s) { return x < s.start; });
    return it == segments.begin() ? segments.front() : *(it - 1);
  }
};

double compute_factor(Fault f) {
  switch (f) {
    case Fault::slow_gpu:
      return 1.6;
    case Fault::gpu_power_cap:
      return 1.3;
    case Fault::cpu_contention:
      return 1.15;
    case Fault::slow_input:
      return 1.25;
    default:
      return 1;
  }
}

double comm_factor(Fault f) {
  switch (f) {
    case Fault::nic_flapping:
      return 1.5;
    case Fault::pfc_storm:
      return 3;
    case Fault::degraded_network:
      return 2.5;
    default:
      return 1;
  }
}

Timeline make_timeline(const Scenario& sc, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> n(0, 1);
  Timeline tl;
  double base = 3 + 5 * u(rng);
  Window slow{-1, -1, 1}, pause{-1, -1, 0};
  if (u(rng) < 0.6) {
    slow.start = 10 + (sc.seconds - 30) * u(rng);
    slow.end = slow.start + 10 + 10 * u(rng);
    slow.factor = 1.3 + 0.7 * u(rng);
  }
  if (u(rng) < 0.4) {
    pause.start = 10 + (sc.seconds - 25) * u(rng);
    pause.end = pause.start + 5 + 7 * u(rng);
  }
  double next_ckpt = 25 + 15 * u(rng);
  double t = -10;  // the job runs before the first sample
  while (t < sc.seconds + 10) {
    if (in(pause, t)) {
      tl.segments.push_back({t, pause.end, Phase::idle});
      t = pause.end;
      continue;
    }
    if (t >= next_ckpt) {
      double len = 4 + 4 * u(rng);
      tl.segments.push_back({t, t + len, Phase::checkpoint});
      t += len;
      next_ckpt = t + 25 + 15 * u(rng);
      continue;
    }
    double step = base * (1 + 0.03 * n(rng)) * (in(slow, t) ? slow.factor : 1);
    double comp = 0.7 * step, comm = 0.3 * step;
    if (after_onset(sc, t)) {
      comp *= compute_factor(sc.fault);
      comm *= comm_factor(sc.fault);
    }
    tl.segments.push_back({t, t + comp, Phase::compute});
    if (is_hang(sc.fault) && after_onset(sc, t)) {
      tl.segments.push_back({t + comp, sc.seconds + 10, Phase::hang});  // the all-reduce never ends
      break;
    }
    tl.segments.push_back({t + comp, t + comp + comm, Phase::comm});
    t += comp + comm;
  }
  for (int m = 0; m < sc.machines; ++m) tl.ckpt_offset.push_back(0.5 * u(rng));
  return tl;
}

// What one machine does at time t: the instantaneous readings and the rates
// its counters grow at.
struct State {
  double util[kGpus], power[kGpus], clock[kGpus];
  double tx, rx;  // bytes/s on ib0
  bool link_up = true;
  double rx_errors, retrans, tx_pause;
  double cpu_user, cpu_system;  // fraction of each CPU
  double psi_cpu, psi_memory;
  double mem_available, disk_write;
  double xid[kGpus];  // the last XID error (0: none)
};

struct MachineModel {
  double offset;      // this machine's constant bias, relative
  double flap_phase;  // nic_flapping: where in its cycle the link starts
  double flap_period;
  double flap_down;
};

State state(const Scenario& sc, const Timeline& tl, const MachineModel& mm, int m, double t) {
  State s{};
  bool faulty = m == sc.faulty && after_onset(sc, t);
  Fault f = faulty ? sc.fault : Fault::none;
  const Segment& seg = tl.at(t);
  Phase phase = seg.phase;
  if (phase == Phase::checkpoint && t < seg.start + tl.ckpt_offset[static_cast<size_t>(m)]) phase = Phase::idle;
  double into = seg.end > seg.start ? (t - seg.start) / (seg.end - seg.start) : 0;
  // The faulty machine's own effects on the job make the compute segment
  // longer: a healthy GPU is busy for its own share, then waits.
  double busy_share = 1 / (after_onset(sc, t) ? compute_factor(sc.fault) : 1);
  for (int g = 0; g < kGpus; ++g) {
    Phase p = phase;
    if (p == Phase::compute) {
      bool slow_one = faulty && (f == Fault::slow_gpu || f == Fault::gpu_power_cap) && g == sc.faulty_gpu;
      bool late_start = faulty && (f == Fault::cpu_contention || (f == Fault::slow_input && g == sc.faulty_gpu));
      bool busy = slow_one ? true : late_start ? into >= 1 - busy_share : into < busy_share;
      if (!busy) p = Phase::idle;
    }
    if (p == Phase::hang && faulty && f == Fault::hang_outside && g == sc.faulty_gpu) p = Phase::idle;
    switch (p) {
      case Phase::hang:  // NCCL's kernel waits for the missing rank
        s.util[g] = 100;
        s.power[g] = 200;
        s.clock[g] = 1980;
        break;
      case Phase::compute:
        s.util[g] = 95;
        s.power[g] = 650;
        s.clock[g] = 1980;
        break;
      case Phase::comm:
        s.util[g] = 60;
        s.power[g] = 350;
        s.clock[g] = 1980;
        break;
      default:
        s.util[g] = 2;
        s.power[g] = 110;
        s.clock[g] = 1980;
        break;
    }
    if (faulty && g == sc.faulty_gpu && f == Fault::slow_gpu) s.clock[g] = 1190;
    if (faulty && g == sc.faulty_gpu && f == Fault::gpu_power_cap && p == Phase::compute) {
      s.power[g] = 390;
      s.clock[g] = 1500;
    }
  }
  double net = phase == Phase::comm ? 20e9 : phase == Phase::compute ? 0.3e9 : 0.05e9;
  if (phase == Phase::comm && after_onset(sc, t)) net /= comm_factor(sc.fault);
  s.tx = s.rx = net;
  s.retrans = 1;
  s.rx_errors = 0;
  s.tx_pause = 0;
  if (f == Fault::nic_flapping) {
    double c = std::fmod(t - sc.onset_s + kT0 + mm.flap_phase, mm.flap_period);
    s.link_up = c >= mm.flap_down;
    if (!s.link_up) s.tx = s.rx = 0;
    s.retrans = 40;
  }
  if (f == Fault::pfc_storm) s.tx_pause = 50000;
  if (f == Fault::degraded_network) {
    s.rx_errors = 200;
    s.retrans = 150;
  }
  double user = phase == Phase::compute ? 0.25 : phase == Phase::checkpoint ? 0.15 : 0.10;
  s.cpu_user = user;
  s.cpu_system = 0.04;
  s.psi_cpu = 0.02;
  s.psi_memory = 0;
  s.mem_available = 400e9;
  s.disk_write = phase == Phase::checkpoint ? 2e9 : 5e6;
  if (f == Fault::cpu_contention) {
    s.cpu_user += 0.45;
    s.psi_cpu = 0.3;
  }
  if (f == Fault::slow_input) s.cpu_user += 0.03;
  if (f == Fault::gpu_xid) s.xid[sc.faulty_gpu] = 63;
  if (f == Fault::memory_leak) {
    double leaked = 2e9 * (t - (sc.onset_s - kT0));
    s.mem_available -= leaked;
    s.psi_memory = std::min(0.6, leaked / 40e9);
  }
  return s;
}

// One machine's counters (cumulative), integrated in kDt steps.
struct Counters {
  double tx = 1e12, rx = 1e12, carrier = 3, rx_errors = 10, retrans = 5000, tx_pause = 100;
  double cpu_user[kCpus] = {1e5, 1e5, 1e5, 1e5}, cpu_system[kCpus] = {2e4, 2e4, 2e4, 2e4};
  double cpu_idle[kCpus] = {9e5, 9e5, 9e5, 9e5};
  double psi_cpu = 100, psi_memory = 10, disk_write = 1e11;
  bool link_up = true;
};

}  // namespace

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::none:
      return "none";
    case Fault::slow_gpu:
      return "slow_gpu";
    case Fault::nic_flapping:
      return "nic_flapping";
    case Fault::pfc_storm:
      return "pfc_storm";
    case Fault::memory_leak:
      return "memory_leak";
    case Fault::cpu_contention:
      return "cpu_contention";
    case Fault::gpu_power_cap:
      return "gpu_power_cap";
    case Fault::degraded_network:
      return "degraded_network";
    case Fault::hang_outside:
      return "hang_outside";
    case Fault::hang_inside:
      return "hang_inside";
    case Fault::slow_input:
      return "slow_input";
    case Fault::gpu_xid:
      return "gpu_xid";
  }
  return "?";
}

const std::vector<Fault>& all_faults() {
  static const std::vector<Fault> f = {Fault::slow_gpu,        Fault::nic_flapping,   Fault::pfc_storm,
                                       Fault::memory_leak,     Fault::cpu_contention, Fault::gpu_power_cap,
                                       Fault::degraded_network};
  return f;
}

const std::vector<Fault>& partial_faults() {
  static const std::vector<Fault> f = {Fault::hang_outside, Fault::hang_inside, Fault::slow_input, Fault::gpu_xid};
  return f;
}

bool is_hang(Fault f) { return f == Fault::hang_outside || f == Fault::hang_inside; }

std::string machine_name(int i) {
  char b[16];
  std::snprintf(b, sizeof b, "node%03d", i);
  return b;
}

Scenario make_scenario(int index, Fault f, double seconds, std::mt19937_64& rng) {
  static const int sizes[] = {8, 16, 32, 64};
  Scenario sc;
  sc.index = index;
  sc.fault = f;
  sc.seconds = seconds;
  sc.machines = sizes[rng() % 4];
  sc.seed = rng();
  if (f != Fault::none) {
    sc.faulty = static_cast<int>(rng() % static_cast<uint64_t>(sc.machines));
    sc.faulty_gpu = static_cast<int>(rng() % kGpus);
    std::uniform_real_distribution<double> onset(0.4 * seconds, 0.6 * seconds);
    sc.onset_s = kT0 + onset(rng);
  }
  return sc;
}

ballast::machine::MetricsTable generate(const Scenario& sc, bool plain) {
  std::mt19937_64 rng(sc.seed), extra(sc.seed ^ 0xecc0ecc0ecc0ecc0ULL);
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> n(0, 1);
  Timeline tl = make_timeline(sc, rng);
  ballast::machine::MetricsTable t;
  std::unordered_map<std::string, uint32_t> ids;
  auto metric = [&](const std::string& name) {
    auto it = ids.find(name);
    if (it != ids.end()) return it->second;
    uint32_t id = static_cast<uint32_t>(t.metrics.size());
    t.metrics.push_back(name);
    ids.emplace(name, id);
    return id;
  };
  auto gpu = [](const char* name, int g) { return std::string(name) + "{gpu=\"" + std::to_string(g) + "\"}"; };
  for (int m = 0; m < sc.machines; ++m) {
    t.nodes.push_back(machine_name(m));
    MachineModel mm{0.02 * n(rng), 3 * u(rng), 3 + 3 * u(rng), 1 + u(rng)};
    Counters c;
    double clock = 0;  // integrated up to here
    auto noisy = [&](double v, double rel) { return v * (1 + mm.offset + rel * n(rng)); };
    for (int k = 0; k <= static_cast<int>(sc.seconds); ++k) {
      double ts = k + 0.2 * u(rng);
      while (clock + kDt <= ts) {
        State s = state(sc, tl, mm, m, clock);
        c.tx += s.tx * kDt;
        c.rx += s.rx * kDt;
        c.rx_errors += s.rx_errors * kDt;
        c.retrans += s.retrans * kDt;
        c.tx_pause += s.tx_pause * kDt;
        if (s.link_up != c.link_up) c.carrier += 1;
        c.link_up = s.link_up;
        for (int p = 0; p < kCpus; ++p) {
          c.cpu_user[p] += s.cpu_user * kDt * (1 + 0.1 * n(rng));
          c.cpu_system[p] += s.cpu_system * kDt;
          c.cpu_idle[p] += std::max(0.0, 1 - s.cpu_user - s.cpu_system) * kDt;
        }
        c.psi_cpu += s.psi_cpu * kDt;
        c.psi_memory += s.psi_memory * kDt;
        c.disk_write += s.disk_write * kDt;
        clock += kDt;
      }
      State s = state(sc, tl, mm, m, ts);
      int64_t ts_ns = std::llround((kT0 + ts) * 1e9);
      auto put = [&](const std::string& name, double v) {
        if (u(rng) < 0.01) return;  // lost
        t.rows.push_back({ts_ns, static_cast<uint32_t>(m), metric(name), v});
      };
      for (int g = 0; g < kGpus; ++g) {
        put(gpu(plain ? "gpu_util" : "DCGM_FI_DEV_GPU_UTIL", g), std::clamp(s.util[g] + 3 * n(rng), 0.0, 100.0));
        put(gpu(plain ? "gpu_power" : "DCGM_FI_DEV_POWER_USAGE", g), noisy(s.power[g], 0.03));
        put(gpu(plain ? "gpu_sm_clock" : "DCGM_FI_DEV_SM_CLOCK", g), s.clock[g] + 5 * n(rng));
        if (!plain) put(gpu("DCGM_FI_DEV_FB_USED", g), noisy(70000, 0.002));
      }
      if (plain) {
        put("net_tx_gbps", noisy(s.tx, 0.05) * 8 / 1e9);
        put("net_rx_gbps", noisy(s.rx, 0.05) * 8 / 1e9);
        put("cpu_util", noisy(100 * (s.cpu_user + s.cpu_system), 0.1));
        put("mem_available_bytes", noisy(s.mem_available, 0.001));
        put("tcp_retrans", std::max(0.0, s.retrans + std::sqrt(s.retrans) * n(rng)));
        continue;
      }
      const std::string ib = "{device=\"ib0\"}";
      put("node_network_transmit_bytes_total" + ib, c.tx);
      put("node_network_receive_bytes_total" + ib, c.rx);
      put("node_network_carrier_changes_total" + ib, c.carrier);
      put("node_network_receive_errs_total" + ib, c.rx_errors);
      put("node_ethtool_tx_pause_ctrl_phy" + ib, c.tx_pause);
      put("node_netstat_Tcp_RetransSegs", c.retrans);
      for (int p = 0; p < kCpus; ++p) {
        std::string cpu = "{cpu=\"" + std::to_string(p) + "\",mode=\"";
        put("node_cpu_seconds_total" + cpu + "user\"}", c.cpu_user[p]);
        put("node_cpu_seconds_total" + cpu + "system\"}", c.cpu_system[p]);
        put("node_cpu_seconds_total" + cpu + "idle\"}", c.cpu_idle[p]);
      }
      put("node_pressure_cpu_waiting_seconds_total", c.psi_cpu);
      put("node_pressure_memory_waiting_seconds_total", c.psi_memory);
      put("node_memory_MemAvailable_bytes", noisy(s.mem_available, 0.001));
      put("node_disk_written_bytes_total{device=\"nvme0n1\"}", c.disk_write);
      // Drawn apart, so that the other series are those of runs without them.
      for (int g = 0; sc.extended && g < kGpus; ++g)
        if (u(extra) >= 0.01)
          t.rows.push_back({ts_ns, static_cast<uint32_t>(m), metric(gpu("DCGM_FI_DEV_XID_ERRORS", g)), s.xid[g]});
    }
  }
  return t;
}

std::vector<StepTimings> step_timings(const Scenario& sc) {
  std::mt19937_64 rng(sc.seed);
  Timeline tl = make_timeline(sc, rng);  // generate()'s first draws: the same timeline
  std::mt19937_64 imbalance(sc.seed ^ 0x9e3779b97f4a7c15ULL);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<StepTimings> out;
  int64_t step = 0;
  const double opt = 0.02;
  for (size_t i = 0; i + 1 < tl.segments.size(); ++i) {
    const Segment& compute = tl.segments[i];
    const Segment& comm = tl.segments[i + 1];
    bool hung = comm.phase == Phase::hang;
    if (compute.phase != Phase::compute || (comm.phase != Phase::comm && !hung)) continue;
    if (compute.start < 0 || (hung ? compute.end : comm.end) > sc.seconds) continue;
    bool after = after_onset(sc, compute.start);
    double len = compute.end - compute.start;
    double busy_share = 1 / (after ? compute_factor(sc.fault) : 1);
    StepTimings st;
    st.end_s = kT0 + (hung ? compute.end : comm.end);
    st.hung = hung;
    for (int r = 0; r < sc.machines * kRanksPerMachine; ++r) {
      int machine = r / kRanksPerMachine, g = r % kRanksPerMachine;
      bool faulty = after && machine == sc.faulty;
      bool slow_one = faulty && (sc.fault == Fault::slow_gpu || sc.fault == Fault::gpu_power_cap) && g == sc.faulty_gpu;
      double busy = slow_one ? len : len * busy_share * (1 - 0.08 * u(imbalance));
      double start = faulty && sc.fault == Fault::cpu_contention ? compute.end - busy : compute.start;
      auto op = [&](const char* type, double s, double d, int32_t mb) {
        st.ops.push_back(ballast_op_timing{r, 0, r, step, type, kT0 + s, d, 0, -1, mb, -1});
      };
      // The late input's wait is counted in the forward.
      double wait = faulty && sc.fault == Fault::slow_input && g == sc.faulty_gpu ? len - busy : 0;
      op("forward-compute", start, wait + busy / 3, 0);
      op("backward-compute", start + wait + busy / 3, busy * 2 / 3, 0);
      double enter = start + wait + busy;
      if (hung) {
        bool stopped = faulty && g == sc.faulty_gpu;
        if (stopped) {
          st.hung_rank = r;
          // Outside: it stops where it would have entered; inside: 30% into
          // the all-reduce (which starts once the last rank entered).
          st.stop_s = kT0 + (sc.fault == Fault::hang_outside ? enter : compute.end + 0.3 * len * 3 / 7);
        }
        if (!(stopped && sc.fault == Fault::hang_outside)) op("separate-grads-all-reduce", enter, NAN, -1);
        continue;
      }
      op("separate-grads-all-reduce", enter, comm.end - opt - enter, -1);
      op("optimizer", comm.end - opt, opt, -1);
    }
    out.push_back(std::move(st));
    ++step;
    if (hung) break;
  }
  return out;
}

}  // namespace bench_lockstep
