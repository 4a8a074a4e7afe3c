// bench/cluster: the cluster link's figures (issue 26), against real
// `ballast run` controllers, a real etcd and a real Slurm started by
// tools/engines. One JSON object per line; each figure the median of --runs.
//   ingest      events/s one controller applies from emulated agents flooding
//               metric batches (20 samples each), durable (fdatasync per
//               batch) and not, and the controller's CPU seconds per 100k
//               events; then the same agents offering 10k and 100k events/s:
//               p50/p99 latency from when a send was due to its acknowledgement
//   nodes       1,000 emulated nodes at 1 Hz: the controller's CPU and memory
//   agent       one real agent (collector at 1 Hz, hang-ring watcher, start-up
//               plugin, cluster link): resident memory and CPU share
//   failover    leader of two killed (lease 5 s): kill -> new leader elected,
//               kill -> first agent served; events lost / applied twice
//               (applied = under a cursor a leader committed to etcd)
//   codec       the controller's per-event work on one metric batch frame, in
//               process: decode_frame (frame -> owned event) and encode_frame
//               (the bus journal's re-encoding), CPU ns per frame, beside a
//               memcpy of the frame (the ceiling)
//   slurm       node fault (an agent killed) -> node.silent -> the policy's
//               evict + replace -> the executor's Slurm backend drains it and
//               requeues the job onto the spare -> training resumed from its
//               checkpoint, by part
//   slurm_relay the same with the ranks reporting only through their nodes'
//               agents (the relayed job channel; the spare's agent too)
//   failover_reattach  the leader of two controllers (etcd, lease 3 s) killed
//               while its Slurm job runs, ranks reporting through their
//               agents: kill -> successor leads -> re-attached -> its first
//               applied rank report; rank 0's steps lost / applied twice
#include "certs.hpp"
#include "link.hpp"

#include "../../tests/core/cluster/cluster_harness.hpp"
#include "command_line.hpp"
#include "journal.hpp"
#include "slurm.hpp"

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

using namespace cluster_test;
using namespace ballast::cluster;
using Clock = std::chrono::steady_clock;

namespace {

int g_runs = 3;
bool g_quick = false;
std::string g_controller_exe = BALLAST_EXE;  // the ingest case's controller (--controller-exe)

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }
double wall_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

void emit(const char* c, const char* metric, double value, const char* unit) {
  std::printf("{\"bench\":\"cluster\",\"case\":\"%s\",\"metric\":\"%s\",\"value\":%.6g,\"unit\":\"%s\"}\n", c, metric,
              value, unit);
  std::fflush(stdout);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median of the runs, and their lowest and highest as metric_min / metric_max.
void emit_runs(const char* c, const std::string& metric, const std::vector<double>& v, const char* unit) {
  emit(c, metric.c_str(), median(v), unit);
  if (v.size() < 2) return;
  emit(c, (metric + "_min").c_str(), *std::min_element(v.begin(), v.end()), unit);
  emit(c, (metric + "_max").c_str(), *std::max_element(v.begin(), v.end()), unit);
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

// CPU seconds (user + system) and resident bytes of a process.
double cpu_s(pid_t pid) {
  std::string s = read_file("/proc/" + std::to_string(pid) + "/stat");
  size_t close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f;
  std::string tok;
  for (size_t i = close + 2; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == ' ') {
      f.push_back(tok);
      tok.clear();
    } else {
      tok += s[i];
    }
  }
  return (std::stod(f[11]) + std::stod(f[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Context switches (voluntary and not) of all of a process's threads alive now.
double context_switches(pid_t pid) {
  double n = 0;
  std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& t :
       std::filesystem::directory_iterator(tasks, std::filesystem::directory_options::skip_permission_denied)) {
    std::ifstream in(t.path() / "status");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0 || line.rfind("nonvoluntary_ctxt_switches:", 0) == 0)
        n += std::stod(line.substr(line.find(':') + 1));
  }
  return n;
}

double rss_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024;
  return 0;
}

std::vector<unsigned char> metric_frame(const std::string& node) {
  std::vector<ballast_metric_sample> s(20);
  std::vector<std::string> names;
  for (int i = 0; i < 20; ++i) names.push_back("metric" + std::to_string(i));
  for (int i = 0; i < 20; ++i) {
    s[static_cast<size_t>(i)] = {node.c_str(), names[static_cast<size_t>(i)].c_str(), 1, 1.0 * i, 0};
  }
  ballast_metric_batch b{sizeof b, 20, s.data()};
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
  ev.topic = "metric.sample";
  ev.ts_ns = 1;
  ev.source.node = node.c_str();
  ev.source.rank = -1;
  ev.source.plugin = "collect";
  ev.payload = &b;
  ev.payload_size = sizeof b;
  std::vector<unsigned char> f;
  ballast::encode_frame(ev, &f);
  return f;
}

struct Controller {
  Proc proc;
  std::string dir;
  void stop() {
    proc.signal(SIGTERM);
    proc.wait();
  }
};

Controller start_controller(const std::string& dir, const std::string& certs, int port, bool durable) {
  std::string cfg = dir + "/ctl.lua";
  std::string text = controller_config("127.0.0.1:" + std::to_string(port), certs, dir + "/ctl");
  if (durable) text.replace(text.find("durable = false"), 15, "durable = true");
  text.replace(text.find("journal = \""), 0, "log_level = \"warn\", ");
  // Emulated nodes connect one after another: give the first ones time.
  text.replace(text.find("heartbeat_ms = 250, silent_after_ms = 2000"), 42,
               "heartbeat_ms = 1000, silent_after_ms = 30000");
  write_file(cfg, text);
  Controller c{spawn({g_controller_exe, "run", cfg}, dir + "/ctl.out", dir + "/ctl.err"), dir};
  // Ready when it accepts TCP connections (a loaded machine can take seconds).
  eventually(30, [&] {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    close(fd);
    return ok;
  });
  return c;
}

// Emulated agents: each a real TLS link speaking the agent's protocol.
struct Emulator {
  struct Node {
    std::string name;
    std::unique_ptr<TlsConfig> tls;
    std::unique_ptr<Link> link;
    std::vector<unsigned char> frame;
    uint64_t seq = 0, acked = 0;
    std::deque<std::pair<uint64_t, double>> in_flight;
    double next_send = 0;
  };
  std::vector<Node> nodes;
  std::atomic<uint64_t> acked_total{0};
  std::vector<double> latencies;
  std::mutex lat_mutex;

  bool connect(const std::string& certs, int count, int port, std::string* error) {
    nodes.resize(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) {
      Node& n = nodes[static_cast<size_t>(i)];
      n.name = "e" + std::to_string(i);
      TlsFiles f{certs + "/ca.crt", certs + "/" + n.name + ".crt", certs + "/node.key"};
      if (TlsConfig::load(f, false, &n.tls) != BALLAST_OK) {
        *error = ballast_last_error_text();
        return false;
      }
      if (Link::connect(*n.tls, "127.0.0.1:" + std::to_string(port), 5000, &n.link, error) != BALLAST_OK) return false;
      std::string hello = nlohmann::json{{"node", n.name}, {"overflow", 0}}.dump();
      n.link->send(MsgType::hello, 0, hello.data(), hello.size());
      bool welcomed = false;
      double until = now_s() + 10;
      while (!welcomed && now_s() < until)
        if (!n.link->pump(
                100, -1,
                [&](const Message& m) {
                  welcomed = welcomed || m.type == MsgType::welcome;
                  return true;
                },
                error))
          return false;
      if (!welcomed) {
        *error = "no welcome for " + n.name;
        return false;
      }
      n.frame = metric_frame(n.name);
    }
    return true;
  }

  static std::string ballast_last_error_text();

  // Drive nodes[first::stride] until `end`: flood (window unacked each) or rate_hz per node.
  void drive(size_t first, size_t stride, double end, int window, double rate_hz) {
    std::vector<pollfd> fds;
    std::vector<size_t> idx;
    for (size_t i = first; i < nodes.size(); i += stride) idx.push_back(i);
    double next_hb = now_s();
    while (now_s() < end) {
      double t = now_s();
      bool hb = t >= next_hb;
      if (hb) next_hb = t + 1.0;
      for (size_t i : idx) {
        Node& n = nodes[i];
        if (hb) n.link->send(MsgType::heartbeat, 0);
        if (rate_hz > 0) {
          // The nodes' phases spread over one period. Every send that is due
          // goes, timed from when it was due (a late send counts its delay).
          if (n.next_send == 0) n.next_send = t + (1.0 / rate_hz) * (static_cast<double>(i % 100) / 100.0);
          while (t >= n.next_send) {
            n.link->send(MsgType::event, ++n.seq, n.frame.data(), n.frame.size());
            n.in_flight.emplace_back(n.seq, n.next_send);
            n.next_send += 1.0 / rate_hz;
          }
        } else {
          while (n.seq - n.acked < static_cast<uint64_t>(window) && n.link->queued_bytes() < (256u << 10)) {
            n.link->send(MsgType::event, ++n.seq, n.frame.data(), n.frame.size());
            n.in_flight.emplace_back(n.seq, t);
          }
        }
      }
      fds.clear();
      for (size_t i : idx)
        fds.push_back(
            {nodes[i].link->fd(), static_cast<short>(POLLIN | (nodes[i].link->queued_bytes() ? POLLOUT : 0)), 0});
      poll(fds.data(), fds.size(), rate_hz > 0 ? std::clamp(static_cast<int>(1000 / rate_hz), 1, 5) : 1);
      std::vector<double> lat;
      for (size_t k = 0; k < idx.size(); ++k) {
        Node& n = nodes[idx[k]];
        std::string error;
        double at = now_s();
        n.link->pump(
            0, -1,
            [&](const Message& m) {
              if (m.type != MsgType::ack) return true;
              while (!n.in_flight.empty() && n.in_flight.front().first <= m.number) {
                lat.push_back(at - n.in_flight.front().second);
                n.in_flight.pop_front();
              }
              acked_total.fetch_add(m.number - n.acked, std::memory_order_relaxed);
              n.acked = m.number;
              return true;
            },
            &error);
      }
      if (!lat.empty()) {
        std::lock_guard lock(lat_mutex);
        latencies.insert(latencies.end(), lat.begin(), lat.end());
      }
    }
  }
};

std::string Emulator::ballast_last_error_text() { return "TLS files"; }

std::vector<std::string> emu_names(int n) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back("e" + std::to_string(i));
  return v;
}

// CPU seconds the whole machine spent busy (all cores), from /proc/stat.
double machine_busy_s() {
  std::istringstream in(read_file("/proc/stat"));
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  return (user + nice + system + irq + softirq + steal) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double load_average() {
  double load = 0;
  std::sscanf(read_file("/proc/loadavg").c_str(), "%lf", &load);
  return load;
}

// The controller's own CPU time per 100k events is the figure that does not
// depend on what else runs on the machine; events/s does (other processes
// take their share of the cores). Runs alternate not durable / durable.
void bench_ingest(const std::string& dir, const std::string& certs) {
  const int nodes = g_quick ? 20 : 100;
  const double seconds = g_quick ? 2 : 5;
  struct Figures {
    std::vector<double> rates, p50s, p99s, cpus, cpu_per_100k, switches_per_1k, emulator_cpus, others, loads;
  };
  // Flooded (256 unacknowledged events per node: the capacity), durable or
  // not; then offered at a fixed rate, not durable: 10k events/s (the
  // issue's 10,000 nodes at 1 Hz, from fewer connections) and 100k.
  const double offered_hz[4] = {0, 0, 10000.0 / nodes, 100000.0 / nodes};
  Figures figures[4];
  for (int run = 0; run < g_runs; ++run) {
    for (int mode = 0; mode < 4; ++mode) {
      const bool durable = mode == 1;
      Figures& f = figures[mode];
      std::string d = dir + "/ingest-" + std::to_string(mode) + "-" + std::to_string(run);
      sh("mkdir -p " + d);
      int port = test::reserve_ports(1);
      f.loads.push_back(load_average());
      Controller c = start_controller(d, certs, port, durable);
      Emulator emu;
      std::string error;
      if (!emu.connect(certs, nodes, port, &error)) {
        std::fprintf(stderr, "ingest: %s\n%s\n", error.c_str(), read_file(d + "/ctl.err").c_str());
        c.stop();
        return;
      }
      double cpu0 = cpu_s(c.proc.pid), self0 = cpu_s(getpid()), cs0 = context_switches(c.proc.pid),
             busy0 = machine_busy_s(), t0 = now_s();
      double end = t0 + seconds;
      const double hz = offered_hz[mode];
      std::thread other([&] { emu.drive(1, 2, end, 256, hz); });
      emu.drive(0, 2, end, 256, hz);
      other.join();
      double elapsed = now_s() - t0;
      double events = static_cast<double>(emu.acked_total.load());
      double cpu = cpu_s(c.proc.pid) - cpu0;
      f.rates.push_back(events / elapsed);
      f.cpus.push_back(cpu / elapsed);
      f.cpu_per_100k.push_back(events > 0 ? cpu / events * 1e5 : 0);
      f.switches_per_1k.push_back(events > 0 ? (context_switches(c.proc.pid) - cs0) / events * 1e3 : 0);
      f.emulator_cpus.push_back((cpu_s(getpid()) - self0) / elapsed);
      f.others.push_back(std::max(0.0, (machine_busy_s() - busy0) / elapsed - f.cpus.back() - f.emulator_cpus.back()));
      f.p50s.push_back(percentile(emu.latencies, 0.5) * 1e3);
      f.p99s.push_back(percentile(emu.latencies, 0.99) * 1e3);
      emu.nodes.clear();
      c.stop();
      sh("rm -f " + d + "/ctl-ingest.journal " + d + "/ctl-bus.journal");
    }
  }
  for (int mode = 0; mode < 4; ++mode) {
    const Figures& f = figures[mode];
    const char* name = std::array{"ingest", "ingest_durable", "ingest_offered_10k", "ingest_offered_100k"}[mode];
    emit_runs(name, "events_per_s", f.rates, "events/s");
    emit(name, "samples_per_s", median(f.rates) * 20, "samples/s");
    emit(name, "target_ratio", median(f.rates) / 100000.0, "x of 100k events/s");
    emit_runs(name, "controller_cpu_s_per_100k_events", f.cpu_per_100k, "CPU-s");
    emit(name, "events_per_controller_cpu_s", median(f.cpu_per_100k) > 0 ? 1e5 / median(f.cpu_per_100k) : 0,
         "events/CPU-s");
    emit_runs(name, "latency_p50", f.p50s, "ms");
    emit_runs(name, "latency_p99", f.p99s, "ms");
    emit(name, "controller_cpu", median(f.cpus), "cores");
    emit(name, "controller_context_switches_per_1k_events", median(f.switches_per_1k), "switches");
    emit(name, "emulator_cpu", median(f.emulator_cpus), "cores");
    emit_runs(name, "other_processes_cpu", f.others, "cores");
    emit_runs(name, "load_average_1min_at_run_start", f.loads, "runnable");
    emit(name, "emulated_nodes", nodes, "nodes");
    emit(name, "runs", static_cast<double>(f.rates.size()), "runs");
  }
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// One timed loop: CPU ns per call of `f` (the thread's CPU clock: the
// machine is shared), the median of 5 rounds of `reps` calls.
template <typename F>
double ns_per_call(int reps, F&& f) {
  std::vector<double> rounds;
  for (int r = 0; r < 5; ++r) {
    double t0 = thread_cpu_s();
    for (int i = 0; i < reps; ++i) f();
    rounds.push_back((thread_cpu_s() - t0) * 1e9 / reps);
  }
  return median(rounds);
}

void bench_codec() {
  const int reps = g_quick ? 20000 : 200000;
  const std::vector<unsigned char> frame = metric_frame("node-0001");
  std::vector<double> dec, enc, copy;
  for (int run = 0; run < g_runs; ++run) {
    ballast::OwnedEvent ev;
    size_t used = 0;
    std::string error;
    dec.push_back(ns_per_call(reps, [&] {
      if (ballast::decode_frame(frame.data(), frame.size(), &ev, &used, &error) != BALLAST_OK) std::abort();
    }));
    std::vector<unsigned char> out;
    out.reserve(frame.size());
    enc.push_back(ns_per_call(reps, [&] {
      out.clear();
      ballast::encode_frame(ev.view(), &out);
    }));
    if (out != frame) {
      std::fprintf(stderr, "codec: the frame encoded again differs from the original\n");
      std::exit(1);
    }
    copy.push_back(ns_per_call(reps, [&] {
      out.assign(frame.begin(), frame.end());
      asm volatile("" : : "r"(out.data()) : "memory");
    }));
  }
  emit("codec", "decode_frame", median(dec), "ns/frame");
  emit("codec", "encode_frame", median(enc), "ns/frame");
  emit("codec", "memcpy_frame", median(copy), "ns/frame");
  emit("codec", "frame_bytes", static_cast<double>(frame.size()), "bytes");
  emit("codec", "decode_per_s", 1e9 / median(dec), "frames/s");
}

void bench_nodes(const std::string& dir, const std::string& certs) {
  const int nodes = g_quick ? 200 : 1000;
  const double seconds = g_quick ? 4 : 10;
  std::vector<double> cpus, rss, p99s;
  for (int run = 0; run < g_runs; ++run) {
    std::string d = dir + "/nodes-" + std::to_string(run);
    sh("mkdir -p " + d);
    int port = test::reserve_ports(1);
    Controller c = start_controller(d, certs, port, true);
    double rss0 = rss_bytes(c.proc.pid);
    Emulator emu;
    std::string error;
    if (!emu.connect(certs, nodes, port, &error)) {
      std::fprintf(stderr, "nodes: %s\n", error.c_str());
      c.stop();
      return;
    }
    double end = now_s() + 2;
    emu.drive(0, 1, end, 0, 1.0);  // warm up
    double cpu0 = cpu_s(c.proc.pid), t0 = now_s();
    emu.latencies.clear();
    emu.drive(0, 1, t0 + seconds, 0, 1.0);
    double elapsed = now_s() - t0;
    cpus.push_back((cpu_s(c.proc.pid) - cpu0) / elapsed * 1000.0 / nodes);
    rss.push_back((rss_bytes(c.proc.pid) - rss0) / (1 << 20) * 1000.0 / nodes);
    p99s.push_back(percentile(emu.latencies, 0.99) * 1e3);
    emu.nodes.clear();
    c.stop();
  }
  emit("nodes_1hz", "controller_cpu_per_1000_nodes", median(cpus), "cores");
  emit("nodes_1hz", "controller_rss_per_1000_nodes", median(rss), "MiB");
  emit("nodes_1hz", "latency_p99", median(p99s), "ms");
  emit("nodes_1hz", "emulated_nodes", nodes, "nodes");
}

void bench_agent(const std::string& dir) {
  const double seconds = g_quick ? 10 : 30;
  std::string certs = dir + "/agent-certs";
  if (sh(engines() + "/make-certs " + certs + " 127.0.0.1 -- a1") != 0) return;
  std::vector<double> cpus, rss;
  for (int run = 0; run < g_runs; ++run) {
    std::string d = dir + "/agent-" + std::to_string(run);
    sh("mkdir -p " + d);
    int port = test::reserve_ports(1);
    Controller c = start_controller(d, certs, port, true);
    std::string cfg = d + "/a1.lua";
    write_file(cfg,
               "return { node = \"a1\", role = \"agent\", log_level = \"warn\",\n"
               "  plugins = { { path = \"ballast-collect\", config = { period = 1 } },\n"
               "              { path = \"ballast-hang\", config = { trace_dir = \"" +
                   d +
                   "\" } },\n"
                   "              \"ballast-startup\" },\n"
                   "  cluster = { controller = \"127.0.0.1:" +
                   std::to_string(port) +
                   "\",\n"
                   "    tls = { ca = \"" +
                   certs + "/ca.crt\", cert = \"" + certs + "/a1.crt\", key = \"" + certs +
                   "/a1.key\" }, spool = { dir = \"" + d + "/spool\" } } }\n");
    Proc a = spawn({BALLAST_EXE, "run", cfg, "--json"}, d + "/a1.out", d + "/a1.err");
    std::this_thread::sleep_for(std::chrono::seconds(3));
    double cpu0 = cpu_s(a.pid), t0 = now_s();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    cpus.push_back((cpu_s(a.pid) - cpu0) / (now_s() - t0));
    rss.push_back(rss_bytes(a.pid) / (1 << 20));
    a.signal(SIGTERM);
    a.wait();
    c.stop();
    auto j = nlohmann::json::parse(read_file(d + "/a1.out"), nullptr, false);
    double forwarded = j.is_discarded() ? 0 : j.value("cluster.forwarded", 0.0);
    if (forwarded == 0)
      std::fprintf(stderr, "agent: nothing forwarded: were ballast-collect, -hang and -startup built? see %s/a1.err\n",
                   d.c_str());
    if (run == 0) emit("agent", "events_forwarded_in_run", forwarded, "events");
  }
  emit("agent", "cpu", median(cpus) * 100, "% of a core");
  emit("agent", "cpu_target_ratio", median(cpus) * 100 / 2.0, "x of 2%");
  emit("agent", "rss", median(rss), "MiB");
  emit("agent", "rss_target_ratio", median(rss) / 64.0, "x of 64 MiB");
}

void bench_failover(const std::string& dir) {
  std::vector<double> elected, served;
  double lost = 0, twice = 0, rolled_back = 0, twice_on_bus = 0;
  for (int run = 0; run < g_runs; ++run) {
    std::string d = dir + "/failover-" + std::to_string(run);
    sh("mkdir -p " + d);
    int etcd_port = test::reserve_ports(11);  // and its peer port, +10
    if (sh(engines() + "/etcd-up " + d + "/etcd " + std::to_string(etcd_port) + " >/dev/null") != 0) {
      std::fprintf(stderr, "failover: etcd did not start\n");
      return;
    }
    std::string certs = d + "/certs";
    sh(engines() + "/make-certs " + certs + " 127.0.0.1 -- n1 n2");
    std::string etcd = "http://127.0.0.1:" + std::to_string(etcd_port);
    int p1 = test::reserve_ports(1), p2 = test::reserve_ports(1);
    auto ctl = [&](const std::string& name, int port) {
      write_file(d + "/" + name + ".lua",
                 controller_config("127.0.0.1:" + std::to_string(port), certs, d + "/" + name, etcd, 5));
      return spawn({BALLAST_EXE, "run", d + "/" + name + ".lua"}, d + "/" + name + ".out", d + "/" + name + ".err");
    };
    Proc c1 = ctl("c1", p1);
    eventually(10, [&] { return read_file(d + "/c1.err").find("is the leader") != std::string::npos; });
    Proc c2 = ctl("c2", p2);
    const uint64_t count = 3000;
    std::vector<Proc> agents;
    for (int i = 1; i <= 2; ++i) {
      std::string node = "n" + std::to_string(i);
      write_file(d + "/" + node + ".lua",
                 agent_config(node, certs, {"127.0.0.1:" + std::to_string(p1), "127.0.0.1:" + std::to_string(p2)},
                              count, 5, 10, d + "/spool-" + node));
      agents.push_back(
          spawn({BALLAST_EXE, "run", d + "/" + node + ".lua"}, d + "/" + node + ".out", d + "/" + node + ".err"));
    }
    eventually(20, [&] { return ingest_counts(d + "/c1-ingest.journal")["n1"].size() > 500; });
    double killed = wall_s();
    c1.signal(SIGKILL);
    c1.wait();
    eventually(30, [&] {
      auto c = ingest_counts(d + "/c2-ingest.journal");
      return !c["n1"].empty() && c["n1"].rbegin()->first >= count && !c["n2"].empty() &&
             c["n2"].rbegin()->first >= count;
    });
    elected.push_back(log_time_s(d + "/c2.err", "is the leader") - killed);
    served.push_back(log_time_s(d + "/c2.err", "connected from") - killed);
    // Applied by the killed leader: its journal up to the cursors its
    // successor started from (its controller.leader event); by the successor:
    // its journal. Above the cursors, the killed leader's journal holds what it
    // published and never committed (gone with its bus).
    auto old = ingest_counts(d + "/c1-ingest.journal"), neu = ingest_counts(d + "/c2-ingest.journal");
    auto leader = nlohmann::json::parse(last_json(d + "/c2-bus.journal", "controller.leader"), nullptr, false);
    auto bus = bus_values(d + "/c2-bus.journal");
    for (std::string node : {"n1", "n2"}) {
      uint64_t cursor = leader.is_object() ? leader["cursors"].value(node, uint64_t{0}) : 0;
      for (uint64_t s = 1; s <= count; ++s) {
        int n = (s <= cursor && old[node].count(s) ? old[node][s] : 0) + (neu[node].count(s) ? neu[node][s] : 0);
        lost += n == 0;
        twice += n > 1;
      }
      for (auto& [s, n] : old[node]) rolled_back += s > cursor;
      for (auto& [v, n] : bus[node]) twice_on_bus += n > 1;
    }
    for (auto& a : agents) a.signal(SIGTERM);
    for (auto& a : agents) a.wait();
    c2.signal(SIGTERM);
    c2.wait();
    sh(engines() + "/etcd-down " + d + "/etcd");
  }
  emit("failover", "kill_to_elected", median(elected), "s");
  emit("failover", "kill_to_first_agent_served", median(served), "s");
  emit("failover", "target_ratio", median(served) / 6.0, "x of lease+1 s");
  emit("failover", "events_lost", lost, "events");
  emit("failover", "events_applied_twice", twice, "events");
  emit("failover", "events_twice_on_the_new_leaders_bus", twice_on_bus, "events");
  emit("failover", "events_published_uncommitted_by_the_killed_leader", rolled_back, "events");
}

// The JSON payload of the first event of `topic` in a bus journal, with its time (wall s).
bool first_event(const std::string& journal, const std::string& topic, double* at) {
  bool found = false;
  ballast::read_journal(
      journal, ballast::JournalMode::skip_bad,
      [&](const ballast::OwnedEvent& ev, uint64_t) {
        if (found || topic != ev.view().topic) return;
        found = true;
        *at = static_cast<double>(ev.view().ts_ns) / 1e9;
      },
      [](const ballast::JournalProblem&) {});
  return found;
}

// A node of a Slurm job fails (its agent is killed, as with its machine):
// Ballast's heartbeats find it (node.silent), the policy evicts and replaces
// it, the executor's Slurm backend drains it, requeues the job onto the spare
// held in a reservation, and the trainer resumes from its checkpoint.
// relay: the ranks report through their node's agent (job.relay_socket), an
// agent on the spare too; case "slurm_recovery_relay".
void bench_slurm(const std::string& dir, bool relay) {
  const std::string kase = relay ? "slurm_recovery_relay" : "slurm_recovery";
  std::vector<double> detection, decision, drain_requeue, slurm_start, resume_part, total;
  const std::string trainer = BALLAST_SOURCE_DIR "/tests/plugins/scheduler/runner/channel_trainer.py";
  const int silent_after_ms = 3000;
  for (int run = 0; run < g_runs; ++run) {
    std::string d = dir + "/" + kase + "-" + std::to_string(run);
    int port = test::reserve_ports(128);  // slurmctld, slurmd +101..+104, the controller +50
    if (sh("SLURM_TEST_PORT=" + std::to_string(port) + " " + engines() + "/slurm-up " + d + " 4 >/dev/null") != 0) {
      std::fprintf(stderr, "slurm: slurm-up failed; see %s/log\n", d.c_str());
      return;
    }
    struct Down {
      std::string d;
      ~Down() { sh(engines() + "/slurm-down " + d); }
    } down{d};
    const std::string certs = d + "/certs", listen = "127.0.0.1:" + std::to_string(port + 50);
    sh(engines() + "/make-certs " + certs + " 127.0.0.1 -- n1 n2 n4 >/dev/null");
    const std::string sockets = d + "/relay-{node}.sock";
    auto tls = [&](const std::string& who) {
      return "tls = { ca = \"" + certs + "/ca.crt\", cert = \"" + certs + "/" + who + ".crt\", key = \"" + certs + "/" +
             who + ".key\" }";
    };
    write_file(d + "/policy.lua",
               "ballast.on(\"node.silent\", function(ev)\n"
               "  local node = (ev.payload or {}).subject or ev.source.node\n"
               "  local why = \"node.silent \" .. tostring(node)\n"
               "  return {{action = \"evict\", subject = node, reason = why},\n"
               "          {action = \"replace\", subject = node, reason = why}}\n"
               "end)\n");
    const std::string job_dir = d + "/job";
    write_file(d + "/controller.lua", "return { node = \"ctl\", role = \"controller\", journal = \"" + d +
                                          "/bus.journal\",\n"
                                          "  plugins = { \"runner\", \"scheduler\" },\n"
                                          "  job = { backend = \"slurm\", ranks = 2, standby = 1, dir = \"" +
                                          job_dir +
                                          "\", progress = false,\n"
                                          "    command = { \"python3\", \"" +
                                          trainer +
                                          "\", \"--steps\", \"60\", \"--step-seconds\", \"0.1\",\n"
                                          "                \"--checkpoint-every\", \"5\" },\n"
                                          "    repair_seconds = 600, placement_timeout_seconds = 10,\n" +
                                          (relay ? "    relay_socket = \"" + sockets + "\",\n" : std::string()) +
                                          "    slurm = { conf = \"" + d +
                                          "/slurm.conf\", nodes = { \"n1\", \"n2\" }, spares = { \"n4\" },\n"
                                          "              reservation = \"ballast-spares\" } },\n"
                                          "  policy = { script = \"" +
                                          d +
                                          "/policy.lua\", fallback = \"escalate\" },\n"
                                          "  cluster = { listen = \"" +
                                          listen + "\", " + tls("controller") +
                                          ",\n"
                                          "    ingest_journal = \"" +
                                          d +
                                          "/ingest.journal\", durable = false,\n"
                                          "    heartbeat_ms = 250, silent_after_ms = " +
                                          std::to_string(silent_after_ms) + " } }\n");
    auto agent = [&](const std::string& node) {
      write_file(
          d + "/" + node + ".lua",
          "return { node = \"" + node + "\", role = \"agent\", log_level = \"warn\",\n" +
              (relay ? "  plugins = { { path = \"runner\", config = { relay = { socket = \"" + sockets + "\" } } } },\n"
                     : std::string()) +
              "  cluster = { controller = { \"" + listen + "\" }, " + tls(node) +
              ",\n"
              "    spool = { dir = \"" +
              d + "/spool-" + node + "\" }, heartbeat_ms = 250, silent_after_ms = " + std::to_string(silent_after_ms) +
              " } }\n");
      return spawn({BALLAST_EXE, "run", d + "/" + node + ".lua"}, d + "/" + node + ".out", d + "/" + node + ".err");
    };
    Proc ctl = spawn({BALLAST_EXE, "run", d + "/controller.lua", "--json"}, d + "/ctl.out", d + "/ctl.err");
    Proc a1 = agent("n1"), a2 = agent("n2");
    std::optional<Proc> a4;
    if (relay) a4.emplace(agent("n4"));
    ballast::slurm::Slurm slurm(d + "/slurm.conf");
    bool up = eventually(60, [&] {
      std::string log = read_file(d + "/ctl.err");
      return log.find("node n1 connected") != std::string::npos && log.find("node n2 connected") != std::string::npos &&
             std::ifstream(job_dir + "/checkpoints/step-00000005.safetensors").good();
    });
    if (!up) {
      std::fprintf(stderr, "slurm: the job did not checkpoint; see %s\n", d.c_str());
      ctl.signal(SIGTERM), a1.signal(SIGTERM), a2.signal(SIGTERM);
      ctl.wait(), a1.wait(), a2.wait();
      if (a4) a4->signal(SIGTERM), a4->wait();
      return;
    }
    const double killed = wall_s();
    a1.signal(SIGKILL);
    a1.wait();
    // Slurm's view, polled: the job running again, on nodes without n1.
    double running_again = 0;
    eventually(60, [&] {
      std::string out, error;
      if (!slurm.run({"squeue", "-h", "-o", "%T %N %r"}, &out, &error)) return false;
      if (out.rfind("RUNNING", 0) == 0 && out.find("n1") == std::string::npos && out.find("n[1") == std::string::npos) {
        running_again = wall_s();
        return true;
      }
      return false;
    });
    bool finished = eventually(90, [&] { return read_file(d + "/ctl.out").find("\"state\"") != std::string::npos; });
    ctl.wait();
    a2.signal(SIGTERM);
    a2.wait();
    if (a4) a4->signal(SIGTERM), a4->wait();
    // The executor's action journal (wall seconds): when each action was
    // received, started and ended; the replace ends at the trainer's hello
    // from its checkpoint.
    double silent_at = 0, decided_at = 0, evict_start = 0, evict_end = 0, replace_start = 0, resumed_at = 0;
    std::ifstream actions(job_dir + "/actions.jsonl");
    for (std::string line; std::getline(actions, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || j.value("event", "") != "end" || j.value("outcome", "") != "ok") continue;
      double received = j.value("received_s", 0.0);
      if (decided_at == 0 || received < decided_at) decided_at = received;
      if (j.value("action", "") == "evict") evict_start = j.value("start_s", 0.0), evict_end = j.value("end_s", 0.0);
      if (j.value("action", "") == "replace")
        replace_start = j.value("start_s", 0.0), resumed_at = j.value("end_s", 0.0);
    }
    if (!finished || running_again == 0 || resumed_at == 0 || evict_end == 0 ||
        !first_event(d + "/bus.journal", "node.silent", &silent_at)) {
      std::fprintf(stderr, "slurm: run %d incomplete (see %s)\n", run, d.c_str());
      continue;
    }
    if (relay && all_json(d + "/bus.journal", "job.rank_report").empty()) {
      std::fprintf(stderr, "slurm: run %d: no report came through the agents (see %s)\n", run, d.c_str());
      continue;
    }
    detection.push_back(silent_at - killed);
    decision.push_back(decided_at - silent_at);
    drain_requeue.push_back(evict_end - evict_start);
    slurm_start.push_back(running_again - replace_start);
    resume_part.push_back(resumed_at - running_again);
    total.push_back(resumed_at - killed);
  }
  emit(kase.c_str(), "runs_complete", static_cast<double>(total.size()), "runs");
  emit(kase.c_str(), "detection", median(detection), "s");
  emit(kase.c_str(), "detection_silent_after", silent_after_ms / 1000.0, "s");
  emit(kase.c_str(), "decision", median(decision), "s");
  emit(kase.c_str(), "evict_drain_and_requeue", median(drain_requeue), "s");
  emit(kase.c_str(), "replace_to_job_running_on_the_spare", median(slurm_start), "s");
  emit(kase.c_str(), "job_running_to_trainer_resumed_from_checkpoint", median(resume_part), "s");
  emit(kase.c_str(), "fault_to_training_resumed", median(total), "s");
}

// The leader of two candidates is killed -9 while its Slurm job runs (ranks
// reporting through their agents, as the relayed channel's spools make every
// step countable); the successor, waiting with the same job table, leads once
// the lease expires and re-attaches to the running attempt. Times from the
// kill (wall clock; the controllers' log lines and bus journal); steps of rank
// 0 lost or applied twice: c1's are those its ingest journal holds up to the
// cursor c2 took over, c2's its executor's step.timing events.
void bench_failover_reattach(const std::string& dir) {
  const char* kase = "failover_reattach";
  const int steps = 100;
  std::vector<double> leads, reattached, first_applied;
  double lost = 0, twice = 0, same_job = 0, held = 0;
  for (int run = 0; run < g_runs; ++run) {
    const std::string d = dir + "/" + kase + "-" + std::to_string(run);
    const int port = test::reserve_ports(128);  // slurmctld, slurmd +101..+104, etcd +70 (+80), controllers +60, +61
    if (sh("SLURM_TEST_PORT=" + std::to_string(port) + " " + engines() + "/slurm-up " + d + " 4 >/dev/null") != 0) {
      std::fprintf(stderr, "%s: slurm-up failed; see %s/log\n", kase, d.c_str());
      return;
    }
    struct Down {
      std::string d;
      ~Down() {
        sh(engines() + "/etcd-down " + d + "/etcd");
        sh(engines() + "/slurm-down " + d);
      }
    } down{d};
    const std::string etcd = "http://127.0.0.1:" + std::to_string(port + 70);
    if (sh(engines() + "/etcd-up " + d + "/etcd " + std::to_string(port + 70) + " >/dev/null") != 0) {
      std::fprintf(stderr, "%s: etcd did not start\n", kase);
      return;
    }
    const std::string certs = d + "/certs", sockets = d + "/agent-{node}.sock", job_dir = d + "/job";
    sh(engines() + "/make-certs " + certs + " 127.0.0.1 -- n1 n2 >/dev/null");
    const std::string key = "fr" + std::to_string(getpid()) + "-" + std::to_string(run);
    const std::string l1 = "127.0.0.1:" + std::to_string(port + 60), l2 = "127.0.0.1:" + std::to_string(port + 61);
    auto candidate = [&](const std::string& name, const std::string& listen) {
      write_file(d + "/" + name + ".lua",
                 relay_candidate_config(name, d, listen, certs, etcd, key, d + "/slurm.conf", job_dir, sockets, steps));
      return spawn({BALLAST_EXE, "run", d + "/" + name + ".lua", "--json"}, d + "/" + name + ".out",
                   d + "/" + name + ".err");
    };
    Proc c1 = candidate("c1", l1);
    eventually(20, [&] { return read_file(d + "/c1.err").find("is the leader") != std::string::npos; });
    Proc c2 = candidate("c2", l2);
    const std::string relay = "plugins = { { path = \"runner\", config = { relay = { socket = \"" + sockets +
                              "\" } } } }, log_level = \"warn\",";
    Proc a1 = start_agent(d, certs, l1 + "," + l2, "n1", 1500, relay);
    Proc a2 = start_agent(d, certs, l1 + "," + l2, "n2", 1500, relay);
    ballast::slurm::Slurm slurm(d + "/slurm.conf");
    std::vector<ballast::slurm::JobInfo> before, after;
    std::string error;
    const bool running = eventually(60,
                                    [&] {
                                      const auto s = applied_steps(d + "/c1-bus.journal", 0);
                                      return !s.empty() && s.back().step >= 10;
                                    }) &&
                         slurm.jobs_named(key, &before, &error) && before.size() == 1;
    const std::string pid0 = read_file(job_dir + "/slurm/run-0/pid-0");
    const double killed = wall_s();
    c1.signal(SIGKILL);
    c1.wait();
    // Slurm's job once re-attached, while it runs (it ends with the job).
    const bool same =
        running && eventually(30, [&] { return read_file(d + "/c2.err").find("re-attached") != std::string::npos; }) &&
        slurm.jobs_named(key, &after, &error) && after.size() == 1 && after[0].id == before[0].id &&
        after[0].restarts == before[0].restarts && read_file(job_dir + "/slurm/run-0/pid-0") == pid0 &&
        kill(std::atoi(pid0.c_str()), 0) == 0;
    const bool finished =
        running && eventually(90, [&] { return read_file(d + "/c2.out").find("\"state\"") != std::string::npos; });
    c2.signal(SIGTERM);
    c2.wait();
    for (Proc* a : {&a1, &a2}) a->signal(SIGTERM), a->wait();
    const double led = log_time_s(d + "/c2.err", "c2 is the leader"),
                 attached = log_time_s(d + "/c2.err", "re-attached to the running attempt 0");
    std::vector<AppliedStep> applied = applied_steps(d + "/c2-bus.journal", 0);
    for (const auto& s : applied_steps(d + "/c2-bus.journal", 1))
      if (applied.empty() || s.at_s < applied.front().at_s) applied.insert(applied.begin(), s);
    if (!finished || led == 0 || attached == 0 || applied.empty()) {
      std::fprintf(stderr, "%s: run %d incomplete (see %s)\n", kase, run, d.c_str());
      continue;
    }
    same_job += same && read_file(job_dir + "/slurm/job.out").find("run 1") == std::string::npos;
    const auto report = nlohmann::json::parse(read_file(d + "/c2.out"), nullptr, false);
    if (report.is_object() && report.contains("counters")) held += report["counters"].value("runner.relay.held", 0.0);
    leads.push_back(led - killed);
    reattached.push_back(attached - killed);
    first_applied.push_back(applied.front().at_s - killed);
    const auto leader = nlohmann::json::parse(last_json(d + "/c2-bus.journal", "controller.leader"), nullptr, false);
    const uint64_t cursor = leader.is_object() ? leader["cursors"].value("n1", uint64_t{0}) : 0;
    std::map<int64_t, int> count;
    for (const int64_t step : relayed_steps_up_to(d + "/c1-ingest.journal", "n1", cursor, 0)) count[step]++;
    for (const auto& s : applied_steps(d + "/c2-bus.journal", 0)) count[s.step]++;
    for (int64_t s = 1; s <= steps; ++s) {
      lost += count[s] == 0;
      twice += count[s] > 1;
    }
  }
  emit(kase, "runs_complete", static_cast<double>(leads.size()), "runs");
  emit(kase, "runs_same_slurm_job_and_rank_pids", same_job, "runs");
  emit(kase, "lease", 3, "s");
  emit_runs(kase, "kill_to_successor_leads", leads, "s");
  emit_runs(kase, "kill_to_reattached", reattached, "s");
  emit_runs(kase, "kill_to_first_applied_rank_report", first_applied, "s");
  emit(kase, "rank0_steps_lost", lost, "steps");
  emit(kase, "rank0_steps_applied_twice", twice, "steps");
  emit(kase, "relayed_reports_held_during_the_takeover", held, "reports");
}

}  // namespace

int main(int argc, char** argv) {
  std::string only;
  CLI::App app(
      "Cluster mode: controller ingest, nodes per controller, agent cost, fail-over and the Slurm "
      "backend, with real etcd, TLS links and Slurm daemons; JSON lines on stdout (docs/benchmarks.md).",
      "bench_cluster");
  app.add_flag("--quick", g_quick, "one short run of each case");
  app.add_option("--runs", g_runs, "runs per case (the median is reported)")->check(CLI::PositiveNumber);
  app.add_option("--controller-exe", g_controller_exe,
                 "the ballast binary the ingest case runs as its controller (to compare builds)");
  app.add_option("--only", only, "one case")
      ->check(CLI::IsMember(
          {"codec", "ingest", "nodes", "agent", "failover", "slurm", "slurm_relay", "failover_reattach"}));
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  if (g_quick && app.count("--runs") == 0) g_runs = 1;
  signal(SIGPIPE, SIG_IGN);
  std::string dir = scratch_dir("bench-cluster");
  std::string certs = dir + "/certs";
  sh("mkdir -p " + certs);
  std::string error;
  if (!bench_cluster::make_certs(certs, emu_names(1000), &error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  // The machine is shared: its load says how much of the 2 cores the run had.
  emit("machine", "load_average_1min_at_start", load_average(), "runnable");
  emit("machine", "cores", static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN)), "cores");
  if (only.empty() || only == "codec") bench_codec();
  if (only.empty() || only == "ingest") bench_ingest(dir, certs);
  if (only.empty() || only == "nodes") bench_nodes(dir, certs);
  if (only.empty() || only == "agent") bench_agent(dir);
  if (only.empty() || only == "failover") bench_failover(dir);
  if (only.empty() || only == "slurm") bench_slurm(dir, false);
  if (only.empty() || only == "slurm_relay") bench_slurm(dir, true);
  if (only.empty() || only == "failover_reattach") bench_failover_reattach(dir);
  return 0;
}
