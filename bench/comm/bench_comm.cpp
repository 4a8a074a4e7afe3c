// bench_comm: allreduce latency (p50, p99) and bus bandwidth of the UCX comm
// plugin (through examples/comm/comm_loop, one process per rank) over sm and
// tcp, next to Open MPI's MPI_Allreduce and the memcpy ceiling measured in
// the same run (for 2 ranks over tcp up to 1 MiB also the kernel's: a plain
// loopback tcp swap of the buffer), with tracing on and off, and each cell's
// speedup over Open MPI paired within rounds; plus the cost of one trace
// record, in a world of one and on an 8-byte allreduce between two processes
// (--trace-only: that alone).
//
//   bench_comm [--ranks 2,4] [--tls sm,tcp] [--reps 3] [--quick] [--sizes B,B,...] [--trace-only]
//
// --sizes replaces the bandwidth sizes (bytes); --quick runs fewer sizes and iterations.
//
// One JSON object per line: {"bench","case","metric","value","unit"}.
// busbw follows nccl-tests: algbw = bytes / time (GB = 1e9), busbw = algbw * 2(n-1)/n,
// with time the median call.
#include "command_line.hpp"

#include <tsc_clock.hpp>
#include <ucx_comm.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

std::string g_loop = BENCH_COMM_LOOP;
std::string g_mpi = BENCH_MPI_PROGRAM;  // empty when MPI was not found
std::string g_trace_dir;                // the ranks' trace rings: a folder of ours, removed at the end

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

double field(const std::string& json, const std::string& key) {
  const auto p = json.find("\"" + key + "\":");
  return p == std::string::npos ? -1 : std::atof(json.c_str() + p + key.size() + 3);
}

// Runs argv in n processes (or once, for mpirun) and returns rank 0's stdout.
std::string run(const std::vector<std::string>& args, int n, const std::string& tls, bool ranks_env) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return "";
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < (ranks_env ? n : 1); ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (ranks_env) {
        setenv("RANK", std::to_string(r).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        setenv("UCX_TLS", tls.c_str(), 1);
        setenv("BALLAST_TRACE_DIR", g_trace_dir.c_str(), 1);
        // Not bound to CPUs (mpirun binds its 2-process runs by default): on
        // this shared 2-CPU VM a rank bound beside another job's process
        // cannot move away, and 1 MiB allreduce p50 went from 0.23 to 1.2 ms
        // in some runs.
      }
      if (r == 0)
        dup2(pipefd[1], 1);
      else
        close(1);
      const int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, 2);
      close(pipefd[0]);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  close(pipefd[1]);
  std::string out;
  char buf[4096];
  ssize_t k;
  while ((k = read(pipefd[0], buf, sizeof buf)) > 0) out.append(buf, size_t(k));
  close(pipefd[0]);
  for (pid_t p : pids) waitpid(p, nullptr, 0);
  return out;
}

struct Figures {
  double p50 = -1, p99 = -1, mean = -1;
};

Figures median_of(std::vector<Figures> v) {
  Figures f;
  if (v.empty()) return f;
  auto med = [&](double Figures::*m) {
    std::vector<double> x;
    for (const auto& e : v)
      if (e.*m >= 0) x.push_back(e.*m);
    if (x.empty()) return -1.0;
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  f.p50 = med(&Figures::p50);
  f.p99 = med(&Figures::p99);
  f.mean = med(&Figures::mean);
  return f;
}

// One run of comm_loop (n ranks), traced or not; {} when it failed.
std::vector<Figures> ours(int n, const std::string& tls, uint64_t bytes, long iters, bool trace) {
  std::vector<std::string> a = {g_loop,
                                "--bytes",
                                std::to_string(bytes),
                                "--iters",
                                std::to_string(iters),
                                "--warmup",
                                std::to_string(std::max<long>(3, iters / 10))};
  if (!trace) a.push_back("--no-trace");
  const std::string o = run(a, n, tls, true);
  if (o.empty()) return {};
  return {{field(o, "p50_us"), field(o, "p99_us"), field(o, "mean_us")}};
}

// One run of the Open MPI peer under mpirun with the settings a user gets:
// its defaults (which, oversubscribed, yield the CPU when idle), with the
// btl limited to tcp,self for the tcp rows.
std::vector<Figures> mpi(int n, const std::string& tls, uint64_t bytes, long iters) {
  if (g_mpi.empty()) return {};
  std::vector<std::string> a = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(n)};
  if (tls == "tcp") a.insert(a.end(), {"--mca", "btl", "tcp,self"});
  a.insert(a.end(),
           {g_mpi, std::to_string(bytes), std::to_string(iters), std::to_string(std::max<long>(3, iters / 10))});
  const std::string o = run(a, n, tls, false);
  if (o.empty()) return {};
  return {{field(o, "p50_us"), field(o, "p99_us"), field(o, "mean_us")}};
}

struct Trio {
  Figures traced, untraced, openmpi;
  // Per round, Open MPI's p50 over ours (traced, untraced): above 1 when we
  // are faster. Paired within a round, so that a slow stretch of the shared
  // machine cancels out instead of landing on one side of a ratio of medians.
  std::vector<double> ratio_traced, ratio_untraced;
  // 2 ranks over tcp: the loopback swap's p50 per round (tcp_swap_us), and
  // per round the swap's time over ours (traced) and over Open MPI's.
  std::vector<double> swap_us, swap_share, swap_share_openmpi;
};

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The floor under a 2-rank allreduce over tcp, where both implementations
// spend their time in the kernel's loopback tcp: this process and a fork of
// it swap `bytes` over two loopback connections, one per direction (one
// shared connection is slower: both ends write it at once), with the same
// 4 MiB socket buffers as the plugin, polling non-blocking sockets, nothing
// reduced. p50 of `iters` swaps (after a tenth as many unmeasured) in us;
// -1 on a failure or after 60 s.
double tcp_swap_us(uint64_t bytes, long iters) {
  const int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || listen(lfd, 2) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    if (lfd >= 0) close(lfd);
    return -1;
  }
  const long warmup = std::max<long>(3, iters / 10);
  const pid_t child = fork();
  if (child < 0) {
    close(lfd);
    return -1;
  }
  const int rank = child == 0 ? 1 : 0;
  int fds[2] = {-1, -1};  // fds[r]: the connection that carries rank r's data
  for (int& fd : fds) {
    if (rank == 0) {
      pollfd pf{lfd, POLLIN, 0};  // a child that could not connect: give up after 10 s
      fd = poll(&pf, 1, 10000) == 1 ? accept(lfd, nullptr, nullptr) : -1;
    } else if ((fd = socket(AF_INET, SOCK_STREAM, 0)) >= 0 &&
               connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      close(fd);
      fd = -1;
    }
  }
  close(lfd);
  const int one = 1, buf = 4 << 20;
  for (int fd : fds) {
    if (fd < 0) continue;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    fcntl(fd, F_SETFL, O_NONBLOCK);
  }
  std::vector<char> out(std::max<uint64_t>(bytes, 1), char(1 + rank)), in(out.size());
  std::vector<double> t;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool ok = fds[0] >= 0 && fds[1] >= 0;
  for (long i = 0; ok && i < warmup + iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t sent = 0, got = 0;
    while (ok && (sent < bytes || got < bytes)) {
      if (sent < bytes) {
        const ssize_t k = send(fds[rank], out.data() + sent, bytes - sent, MSG_NOSIGNAL);
        if (k > 0)
          sent += uint64_t(k);
        else if (k < 0 && errno != EAGAIN)
          ok = false;
      }
      if (got < bytes) {
        const ssize_t k = recv(fds[1 - rank], in.data() + got, bytes - got, 0);
        if (k > 0)
          got += uint64_t(k);
        else if (k == 0 || errno != EAGAIN)
          ok = false;  // the peer closed, or an error
      }
      if (std::chrono::steady_clock::now() > give_up) ok = false;
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= warmup) t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  for (int fd : fds)
    if (fd >= 0) close(fd);
  if (rank == 1) _exit(ok ? 0 : 1);
  int st = 0;
  waitpid(child, &st, 0);
  return ok && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? median(t) : -1;
}

// reps rounds of [traced, untraced, Open MPI] (and with_swap the loopback
// swap), each figure the median over the rounds: they alternate, so that a
// noisy stretch of the shared machine falls on all alike rather than on
// whichever ran then.
Trio measure(int n, const std::string& tls, uint64_t bytes, long iters, int reps, bool with_swap = false) {
  std::vector<Figures> on, off, m;
  Trio t;
  for (int i = 0; i < reps; ++i) {
    const auto a = ours(n, tls, bytes, iters, true);
    const auto b = ours(n, tls, bytes, iters, false);
    const auto c = mpi(n, tls, bytes, iters);
    on.insert(on.end(), a.begin(), a.end());
    off.insert(off.end(), b.begin(), b.end());
    m.insert(m.end(), c.begin(), c.end());
    if (with_swap) {
      const double sw = tcp_swap_us(bytes, iters);
      if (sw > 0) {
        t.swap_us.push_back(sw);
        if (!a.empty() && a[0].p50 > 0) t.swap_share.push_back(sw / a[0].p50);
        if (!c.empty() && c[0].p50 > 0) t.swap_share_openmpi.push_back(sw / c[0].p50);
      }
    }
    if (c.empty() || c[0].p50 <= 0) continue;
    if (!a.empty() && a[0].p50 > 0) t.ratio_traced.push_back(c[0].p50 / a[0].p50);
    if (!b.empty() && b[0].p50 > 0) t.ratio_untraced.push_back(c[0].p50 / b[0].p50);
  }
  t.traced = median_of(on);
  t.untraced = median_of(off);
  t.openmpi = median_of(m);
  return t;
}

// One result line. A value that may be negative (a difference) is printed
// through here; emit() skips -1, which stands for "not measured".
void print_result(const std::string& cs, const std::string& metric, double value, const std::string& unit) {
  std::printf("{\"bench\":\"comm\",\"case\":\"%s\",\"metric\":\"%s\",\"value\":%.4g,\"unit\":\"%s\"}\n", cs.c_str(),
              metric.c_str(), value, unit.c_str());
  std::fflush(stdout);
}

void emit(const std::string& cs, const std::string& metric, double value, const std::string& unit) {
  if (value >= 0) print_result(cs, metric, value, unit);
}

double memcpy_gbs(uint64_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  const int iters = int(std::max<uint64_t>(3, (1ull << 30) / bytes));
  std::vector<double> t;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      std::memcpy(b.data(), a.data(), bytes);
      asm volatile("" ::"r"(b.data()) : "memory");
    }
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  std::sort(t.begin(), t.end());
  return double(bytes) / t[2] / 1e9;
}

// The operation both record measurements time: an 8-byte f32 sum allreduce.
ballast_comm_args allreduce_8b(const float* in, float* out) {
  ballast_comm_args a{};
  a.size = sizeof a;
  a.op = BALLAST_OP_ALLREDUCE;
  a.dtype = BALLAST_DT_F32;
  a.sendbuf = in;
  a.recvbuf = out;
  a.count = 2;
  return a;
}

// The floor under a record's cost: one read of the clock that stamps an
// operation's end (the TSC where the kernel counts time with it, else the
// vDSO), which a traced operation takes and an untraced one does not.
double clock_read_ns() {
  ballast::comm::TscClock clock;
  std::vector<double> t;
  uint64_t sink = 0;
  for (int rep = 0; rep < 11; ++rep) {
    const int iters = 200000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) sink += clock.now();
    t.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  asm volatile("" ::"r"(sink));
  return median(t);
}

// The cost of one operation's bookkeeping with and without its trace record:
// an 8-byte allreduce in a world of one (no communication), in process.
// Untraced, traced, and traced with an exact end time (as operations of
// 64 KiB and more always are; small ones end on the coarse clock where the
// kernel's clocksource is not the TSC, else the same) blocks alternate, and
// the median differences are taken, so that a noisy machine slows all alike.
bool trace_cost() {
  using namespace ballast::comm;
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  Comm* comm[3] = {nullptr, nullptr, nullptr};
  for (int k = 0; k < 3; ++k) {
    ballast_comm_config cfg{};
    cfg.size = sizeof cfg;
    cfg.rank = -1;
    cfg.flags = k == 0 ? BALLAST_COMM_NO_TRACE : 0;
    cfg.trace_dir = g_trace_dir.c_str();
    setenv("BALLAST_TRACE_EXACT", k == 2 ? "1" : "0", 1);  // read once per world
    if (comm_init(&cfg, &comm[k]) != BALLAST_OK) {
      std::fprintf(stderr, "bench_comm: trace record in a world of one: init: %s\n", last_error());
      for (Comm* c : comm)
        if (c) comm_destroy(c);
      return false;
    }
  }
  unsetenv("BALLAST_TRACE_EXACT");
  float in[2] = {1, 2}, out[2];
  const ballast_comm_args a = allreduce_8b(in, out);
  const int iters = 20000;
  std::vector<double> t[3], diff[3];
  for (int rep = 0; rep < 41; ++rep) {
    double ns[3];
    for (int k = 0; k < 3; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) comm_run(comm[k], &a);
      ns[k] = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / iters;
      t[k].push_back(ns[k]);
    }
    diff[1].push_back(ns[1] - ns[0]);
    diff[2].push_back(ns[2] - ns[0]);
  }
  emit("trace_record", "op_ns_untraced", median(t[0]), "ns");
  emit("trace_record", "op_ns_traced", median(t[1]), "ns");
  emit("trace_record", "trace_cost", median(diff[1]), "ns/op");
  emit("trace_record", "op_ns_traced_exact", median(t[2]), "ns");
  emit("trace_record", "trace_cost_exact", median(diff[2]), "ns/op");
  emit("trace_record", "clock_read", clock_read_ns(), "ns");
  for (Comm* c : comm) comm_destroy(c);
  return true;
}

// One rank of one pairing of trace_cost_2ranks: the median per-block
// difference (traced - untraced) and each world's median; false on a failure.
bool pair_blocks(int rank, const int port[2], bool control, double* diff_ns, double* untraced, double* traced) {
  using namespace ballast::comm;
  Comm* comm[2] = {nullptr, nullptr};
  bool ok = true;
  for (int k = 0; k < 2 && ok; ++k) {
    ballast_comm_config cfg{};
    cfg.size = sizeof cfg;
    cfg.rank = rank;
    cfg.nranks = 2;
    cfg.master_addr = "127.0.0.1";
    cfg.master_port = port[k];
    cfg.flags = k == 0 || control ? BALLAST_COMM_NO_TRACE : 0;
    cfg.trace_dir = g_trace_dir.c_str();
    ok = comm_init(&cfg, &comm[k]) == BALLAST_OK;
    if (!ok) std::fprintf(stderr, "bench_comm: trace record, rank %d: init: %s\n", rank, last_error());
  }
  float in[2] = {1, 2}, out[2];
  const ballast_comm_args a = allreduce_8b(in, out);
  for (int i = 0; i < 1000 && ok; ++i) ok = comm_run(comm[0], &a) == BALLAST_OK && comm_run(comm[1], &a) == BALLAST_OK;
  const int iters = 1000;
  std::vector<double> t[2], diff;
  for (int rep = 0; rep < 151 && ok; ++rep) {
    double ns[2];
    for (int j = 0; j < 2; ++j) {
      const int k = rep % 2 ? 1 - j : j;  // which goes first alternates too
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters && ok; ++i) ok = comm_run(comm[k], &a) == BALLAST_OK;
      ns[k] = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / iters;
      t[k].push_back(ns[k]);
    }
    diff.push_back(ns[1] - ns[0]);
  }
  if (!ok && comm[1]) std::fprintf(stderr, "bench_comm: trace record, rank %d: %s\n", rank, last_error());
  for (Comm* c : comm)
    if (c) comm_destroy(c);
  *diff_ns = median(diff);
  *untraced = median(t[0]);
  *traced = median(t[1]);
  return ok;
}

// One pairing: this process as rank 0, a fork of it as rank 1.
bool pairing(bool control, double* diff_ns, double* untraced, double* traced) {
  const int port[2] = {free_port(), free_port()};
  const pid_t peer = fork();
  if (peer == 0) _exit(pair_blocks(1, port, control, diff_ns, untraced, traced) ? 0 : 1);
  if (peer < 0) return false;
  const bool ok = pair_blocks(0, port, control, diff_ns, untraced, traced);
  int st = 0;
  waitpid(peer, &st, 0);
  return ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

// What a trace record costs a real operation: an 8-byte allreduce between
// two processes over sm, which besides the world-of-one bookkeeping copies
// the operation's progress into its record at the end. Each process holds
// a traced and an untraced world; blocks of 1000 operations alternate
// between them, and a pairing's figure is the median of the per-block
// differences. Each pairing is followed by its control, both worlds
// untraced: what the method reads where there is nothing to find. The
// figures are medians over 7 pairings (a single one swings by tens of ns on
// this VM). Returns the cost in ns, -1 on a failure.
double trace_cost_2ranks() {
  const char* old_tls = std::getenv("UCX_TLS");
  const std::string saved = old_tls ? old_tls : "";
  setenv("UCX_TLS", "sm,self", 1);
  std::vector<double> cost, control, untraced, traced;
  bool ok = true;
  for (int i = 0; i < 7 && ok; ++i) {
    double d, u, t;
    ok = pairing(false, &d, &u, &t);
    cost.push_back(d);
    untraced.push_back(u);
    traced.push_back(t);
    ok = ok && pairing(true, &d, &u, &t);
    control.push_back(d);
  }
  if (old_tls)
    setenv("UCX_TLS", saved.c_str(), 1);
  else
    unsetenv("UCX_TLS");
  if (!ok) return -1;
  emit("trace_record", "op_ns_untraced_2ranks", median(untraced), "ns");
  emit("trace_record", "op_ns_traced_2ranks", median(traced), "ns");
  print_result("trace_record", "trace_cost_2ranks", median(cost), "ns/op");  // differences: may be negative
  print_result("trace_record", "trace_cost_2ranks_control", median(control), "ns/op");
  return median(cost);
}

// What tracing adds to an operation, in % of its untraced p50: the record's
// cost on a 2-process operation (trace_cost_2ranks), since across 2-4
// processes the traced and untraced p50 of separate runs differ by more than
// that from run to run (the trace_overhead lines).
void emit_trace_share(const std::string& cs, double untraced_p50_us, double cost_ns) {
  if (untraced_p50_us > 0 && cost_ns >= 0) emit(cs, "trace_share", 100.0 * cost_ns / (untraced_p50_us * 1000), "%");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks = {2, 4};
  std::vector<std::string> tlss = {"sm,self", "tcp"};
  int reps = 3;
  bool quick = false, trace_only = false;
  std::vector<uint64_t> sizes;
  CLI::App app(
      "Allreduce latency and bus bandwidth of the UCX comm plugin against Open MPI and the memcpy "
      "ceiling, and the cost of a trace record; JSON lines on stdout (docs/benchmarks.md).",
      "bench_comm");
  app.add_option("--ranks", ranks, "rank counts (default 2,4)")->delimiter(',')->check(CLI::Range(2, 64));
  app.add_option("--tls", tlss, "UCX transports: sm, tcp (default both)")
      ->delimiter(',')
      ->check(CLI::IsMember({"sm", "tcp"}))
      ->transform([](std::string t) { return t == "sm" ? std::string("sm,self") : t; });
  app.add_option("--reps", reps, "rounds (default 3)")->check(CLI::PositiveNumber);
  app.add_flag("--quick", quick, "fewer sizes and iterations");
  app.add_option("--sizes", sizes, "bandwidth sizes in bytes, replacing the default ones")->delimiter(',');
  app.add_flag("--trace-only", trace_only, "the cost of a trace record only");
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  char dir[] = "/dev/shm/ballast-bench-comm-XXXXXX";  // tmpfs, as in production
  if (!mkdtemp(dir)) {
    std::perror("bench_comm: cannot create a trace folder in /dev/shm");
    return 1;
  }
  g_trace_dir = dir;
  struct Cleanup {
    ~Cleanup() { std::filesystem::remove_all(g_trace_dir); }
  } cleanup;
  const bool one_ok = trace_cost();
  const double cost = trace_cost_2ranks();
  if (cost < 0) std::fprintf(stderr, "bench_comm: the trace record's cost on 2 processes was not measured\n");
  if (trace_only) return one_ok && cost >= 0 ? 0 : 1;
  std::vector<uint64_t> lat_sizes = {8, 64, 1024, 8192, 65536};
  std::vector<uint64_t> bw_sizes = {65536, 262144, 1u << 20, 4u << 20, 16u << 20, 64u << 20, 256u << 20};
  if (quick) {
    lat_sizes = {8, 65536};
    bw_sizes = {65536, 1u << 20, 64u << 20};
  }
  if (!sizes.empty()) bw_sizes = sizes;
  for (uint64_t b : bw_sizes) emit("memcpy/" + std::to_string(b), "bandwidth", memcpy_gbs(b), "GB/s");
  for (const auto& tls : tlss)
    for (int n : ranks) {
      const std::string tl = tls == "sm,self" ? "sm" : tls;
      const double factor = 2.0 * (n - 1) / n;
      for (uint64_t b : lat_sizes) {
        const long iters = quick ? 500 : 2000;
        const std::string cs = "allreduce/" + tl + "/" + std::to_string(n) + "ranks/" + std::to_string(b) + "B";
        const Trio t = measure(n, tls, b, iters, reps);
        const Figures &on = t.traced, &off = t.untraced, &m = t.openmpi;
        emit(cs, "p50_ballast", on.p50, "us");
        emit(cs, "p99_ballast", on.p99, "us");
        emit(cs, "p50_ballast_notrace", off.p50, "us");
        emit(cs, "p50_openmpi", m.p50, "us");
        emit(cs, "p99_openmpi", m.p99, "us");
        emit(cs, "speedup_vs_openmpi", median(t.ratio_traced), "x");
        emit(cs, "speedup_vs_openmpi_notrace", median(t.ratio_untraced), "x");
        if (on.p50 > 0 && off.p50 > 0) print_result(cs, "trace_overhead", 100.0 * (on.p50 - off.p50) / off.p50, "%");
        emit_trace_share(cs, off.p50, cost);
      }
      for (uint64_t b : bw_sizes) {
        const long iters = long(std::clamp<uint64_t>((quick ? 256ull << 20 : 1ull << 30) / b, 9, 1000));
        const std::string cs = "allreduce/" + tl + "/" + std::to_string(n) + "ranks/" + std::to_string(b) + "B";
        // The swap as a floor only up to 1 MiB, where a 2-rank allreduce over
        // tcp sends one message each way (ours from 128 KiB): beyond, one
        // send of the whole buffer is slower than the ring's 1 MiB chunks.
        const Trio t = measure(n, tls, b, iters, reps, tls == "tcp" && n == 2 && b <= (1u << 20));
        const Figures &on = t.traced, &off = t.untraced, &m = t.openmpi;
        // The median call, not the mean: on a shared machine a descheduled
        // rank adds milliseconds to a few calls and would swamp the mean.
        auto busbw = [&](const Figures& f) { return f.p50 > 0 ? double(b) / (f.p50 * 1e-6) / 1e9 * factor : -1; };
        emit(cs, "busbw_ballast", busbw(on), "GB/s");
        emit(cs, "busbw_ballast_notrace", busbw(off), "GB/s");
        emit(cs, "busbw_openmpi", busbw(m), "GB/s");
        emit(cs, "speedup_vs_openmpi", median(t.ratio_traced), "x");
        emit(cs, "speedup_vs_openmpi_notrace", median(t.ratio_untraced), "x");
        const double sw = median(t.swap_us);
        emit(cs, "busbw_tcp_swap", sw > 0 ? double(b) / (sw * 1e-6) / 1e9 * factor : -1, "GB/s");
        emit(cs, "fraction_of_tcp_swap", median(t.swap_share), "x");
        emit(cs, "fraction_of_tcp_swap_openmpi", median(t.swap_share_openmpi), "x");
        if (on.p50 > 0 && off.p50 > 0) print_result(cs, "trace_overhead", 100.0 * (on.p50 - off.p50) / off.p50, "%");
        emit_trace_share(cs, off.p50, cost);
      }
    }
  return 0;
}
