// comm_loop: loop one collective through a comm plugin, the way a trainer
// would: it embeds a Ballast host (abi/ballast/host.h), loads the plugin into
// it without starting it, and calls the plugin's ballast.comm table.
//
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 comm_loop --op allreduce --bytes 1048576 &
//   RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 comm_loop --op allreduce --bytes 1048576
//
// or `ballast launch -n 2 -- comm_loop ...`. Rank 0 prints one JSON line of
// figures. --in-flight K starts K of the collective per iteration (each into
// its own output buffer) before waiting for them, as a trainer overlapping
// its gradient buckets does; an iteration's time is that of all K. --fault
// injects a failure on --fault-rank at --fault-iter (for tests and
// demonstrations of the hang detector): kill (SIGKILL itself),
// stop (SIGSTOP itself), skip (leave the collective out), other (call a
// broadcast instead), exit (exit 3 without a word), slow (sleep 50 ms before
// every collective from that iteration on). Just before, the faulty rank
// writes "comm_loop: rank R: fault KIND at iteration I, monotonic_ns T" to
// stderr (CLOCK_MONOTONIC, the same clock in every process of the host), so
// that a harness can time how long the detection took.
#include <nlohmann/json.hpp>

#include <ballast/comm.h>
#include <ballast/host.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace {

int usage(const char* why) {
  std::fprintf(
      stderr,
      "comm_loop: %s\n"
      "usage: comm_loop [--plugin PATH] [--op allreduce|broadcast|reduce|allgather|reduce_scatter|alltoall|barrier]\n"
      "                 [--bytes N] [--dtype f32|f64|f16|bf16|i32|i64|u8] [--redop sum|prod|min|max]\n"
      "                 [--iters N] [--warmup N] [--in-flight K] [--timeout-ms N] [--check] [--no-trace]\n"
      "                 [--fault kill|stop|skip|other|exit|slow --fault-rank R --fault-iter I]\n",
      why);
  return 2;
}

template <size_t N>
int lookup(const char* const (&names)[N], const std::string& s) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return int(i);
  return -1;
}

const char* const kOps[] = {"none",           "allreduce", "broadcast", "reduce", "allgather",
                            "reduce_scatter", "alltoall",  "send",      "recv",   "barrier"};
const char* const kDtypes[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
const char* const kRedops[] = {"sum", "prod", "min", "max"};

// Element i of rank r's input, as a small integer exact in every dtype.
int value(int rank, uint64_t i) { return int((uint64_t(rank) * 7 + i * 3) % 11) + 1; }

void store(void* buf, uint32_t dtype, uint64_t i, double v) {
  char* p = static_cast<char*>(buf);
  switch (dtype) {
    case BALLAST_DT_F32: {
      float f = float(v);
      std::memcpy(p + 4 * i, &f, 4);
      break;
    }
    case BALLAST_DT_F64:
      std::memcpy(p + 8 * i, &v, 8);
      break;
    case BALLAST_DT_I32: {
      int32_t x = int32_t(v);
      std::memcpy(p + 4 * i, &x, 4);
      break;
    }
    case BALLAST_DT_I64: {
      int64_t x = int64_t(v);
      std::memcpy(p + 8 * i, &x, 8);
      break;
    }
    case BALLAST_DT_U8:
      p[i] = char(uint8_t(int64_t(v)));
      break;
    case BALLAST_DT_BF16: {
      float f = float(v);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      uint16_t h = uint16_t(b >> 16);
      std::memcpy(p + 2 * i, &h, 2);
      break;
    }
    case BALLAST_DT_F16: {  // small integers only: exact
      float f = float(v);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      const uint32_t e = (b >> 23) & 0xff;
      uint16_t h = uint16_t(((b >> 16) & 0x8000u) | (f == 0 ? 0 : ((e - 112) << 10) | ((b >> 13) & 0x3ff)));
      std::memcpy(p + 2 * i, &h, 2);
      break;
    }
  }
}

double load(const void* buf, uint32_t dtype, uint64_t i) {
  const char* p = static_cast<const char*>(buf);
  switch (dtype) {
    case BALLAST_DT_F32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case BALLAST_DT_F64: {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      return d;
    }
    case BALLAST_DT_I32: {
      int32_t x;
      std::memcpy(&x, p + 4 * i, 4);
      return x;
    }
    case BALLAST_DT_I64: {
      int64_t x;
      std::memcpy(&x, p + 8 * i, 8);
      return double(x);
    }
    case BALLAST_DT_U8:
      return uint8_t(p[i]);
    case BALLAST_DT_BF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      uint32_t b = uint32_t(h) << 16;
      float f;
      std::memcpy(&f, &b, 4);
      return f;
    }
    default: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
      const double mag = e == 0 ? m / 1024.0 / 16384.0 : (1.0 + m / 1024.0) * std::ldexp(1.0, int(e) - 15);
      return (h & 0x8000) ? -mag : mag;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string plugin, op_name = "allreduce", dtype_name = "f32", redop_name = "sum", fault;
  uint64_t bytes = 8;
  long iters = 100, warmup = 10, in_flight = 1, timeout_ms = 0, fault_rank = -1, fault_iter = 0;
  bool check = false, no_trace = false;
  if (const char* env = std::getenv("BALLAST_COMM_PLUGIN")) plugin = env;
#ifdef BALLAST_DEFAULT_COMM_PLUGIN
  if (plugin.empty()) plugin = BALLAST_DEFAULT_COMM_PLUGIN;
#endif
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--check")
      check = true;
    else if (a == "--no-trace")
      no_trace = true;
    else if ((a == "--plugin" || a == "--op" || a == "--dtype" || a == "--redop" || a == "--bytes" || a == "--iters" ||
              a == "--warmup" || a == "--in-flight" || a == "--timeout-ms" || a == "--fault" || a == "--fault-rank" ||
              a == "--fault-iter")) {
      if (!(v = next())) return usage(("missing value after " + a).c_str());
      if (a == "--plugin")
        plugin = v;
      else if (a == "--op")
        op_name = v;
      else if (a == "--dtype")
        dtype_name = v;
      else if (a == "--redop")
        redop_name = v;
      else if (a == "--fault")
        fault = v;
      else {
        char* end = nullptr;
        const long long x = std::strtoll(v, &end, 10);
        if (!end || *end || x < 0) return usage(("bad number '" + std::string(v) + "' after " + a).c_str());
        if (a == "--bytes")
          bytes = uint64_t(x);
        else if (a == "--iters")
          iters = long(x);
        else if (a == "--warmup")
          warmup = long(x);
        else if (a == "--in-flight")
          in_flight = long(x);
        else if (a == "--timeout-ms")
          timeout_ms = long(x);
        else if (a == "--fault-rank")
          fault_rank = long(x);
        else
          fault_iter = long(x);
      }
    } else if (a == "--help" || a == "-h") {
      usage("loops a collective through a comm plugin");
      return 0;
    } else {
      return usage(("unknown argument " + a).c_str());
    }
  }
  const int op = lookup(kOps, op_name), dtype = lookup(kDtypes, dtype_name), redop = lookup(kRedops, redop_name);
  if (op <= 0 || op == BALLAST_OP_SEND || op == BALLAST_OP_RECV) return usage(("unknown --op " + op_name).c_str());
  if (dtype < 0) return usage(("unknown --dtype " + dtype_name).c_str());
  if (redop < 0) return usage(("unknown --redop " + redop_name).c_str());
  if (!fault.empty() && fault != "kill" && fault != "stop" && fault != "skip" && fault != "other" && fault != "exit" &&
      fault != "slow")
    return usage(("unknown --fault " + fault).c_str());
  if (in_flight < 1) return usage("--in-flight must be at least 1");
  if (plugin.empty()) return usage("no plugin: give --plugin PATH or BALLAST_COMM_PLUGIN");

  // The plugin is loaded and created, not started: no trace publisher on a
  // bus nobody reads.
  ballast_host* host = nullptr;
  const void* table = nullptr;
  if (ballast_host_create(nullptr, &host) != BALLAST_OK ||
      ballast_host_load_plugin(host, plugin.c_str(), nullptr) != BALLAST_OK ||
      ballast_host_get_interface(host, nullptr, BALLAST_COMM_INTERFACE, BALLAST_COMM_VERSION, &table) != BALLAST_OK) {
    std::fprintf(stderr, "comm_loop: cannot use %s: %s\n", plugin.c_str(), ballast_last_error());
    return 1;
  }
  auto* api = static_cast<const ballast_comm_api*>(table);
  if (api->size < BALLAST_COMM_API_V1_SIZE) {
    std::fprintf(stderr, "comm_loop: %s's %s table is smaller than v1\n", plugin.c_str(), BALLAST_COMM_INTERFACE);
    return 1;
  }
  void* const state = nullptr;  // an embedder has no plugin state (comm.h)
  ballast_comm_config cfg{};
  cfg.size = sizeof cfg;
  cfg.rank = -1;
  cfg.flags = no_trace ? BALLAST_COMM_NO_TRACE : 0;
  cfg.timeout_ns = int64_t(timeout_ms) * 1000000;
  ballast_comm* comm = nullptr;
  if (api->init(state, &cfg, &comm) != BALLAST_OK) {
    std::fprintf(stderr, "comm_loop: init failed: %s\n", api->last_error(state));
    return 1;
  }
  ballast_comm_info info{};
  info.size = sizeof info;
  api->info(comm, &info);
  const int rank = info.rank, n = info.nranks;
  const uint32_t es = ballast_dtype_size(uint32_t(dtype));
  uint64_t count = bytes / es;
  // Per-rank counts for the gathering/scattering ops: --bytes is what each rank contributes.
  const bool blocked = op == BALLAST_OP_ALLGATHER || op == BALLAST_OP_REDUCE_SCATTER || op == BALLAST_OP_ALLTOALL;
  if (op == BALLAST_OP_REDUCE_SCATTER || op == BALLAST_OP_ALLTOALL)
    count = std::max<uint64_t>(count / uint64_t(n), bytes ? 1 : 0);
  const uint64_t in_elems =
      (op == BALLAST_OP_REDUCE_SCATTER || op == BALLAST_OP_ALLTOALL) ? count * uint64_t(n) : count;
  const uint64_t out_elems = blocked && op != BALLAST_OP_REDUCE_SCATTER ? count * uint64_t(n) : count;
  std::vector<char> in(std::max<uint64_t>(in_elems * es, 1));
  std::vector<std::vector<char>> outs(size_t(in_flight), std::vector<char>(std::max<uint64_t>(out_elems * es, 1)));
  for (uint64_t i = 0; i < in_elems; ++i) store(in.data(), uint32_t(dtype), i, value(rank, i));

  ballast_comm_args args{};
  args.size = sizeof args;
  args.op = uint32_t(op);
  args.dtype = uint32_t(dtype);
  args.redop = uint32_t(redop);
  args.sendbuf = in.data();
  args.count = count;
  args.root = 0;
  std::vector<double> lat;
  lat.reserve(size_t(iters));
  int rc = BALLAST_OK;
  std::string error;
  for (long it = -warmup; it < iters && rc == BALLAST_OK; ++it) {
    if (!fault.empty() && rank == fault_rank && it == fault_iter) {
      timespec now{};
      clock_gettime(CLOCK_MONOTONIC, &now);
      std::fprintf(stderr, "comm_loop: rank %d: fault %s at iteration %ld, monotonic_ns %lld\n", rank, fault.c_str(),
                   it, (long long)now.tv_sec * 1000000000LL + now.tv_nsec);
      std::fflush(stderr);
      if (fault == "kill") raise(SIGKILL);
      if (fault == "stop") raise(SIGSTOP);
      if (fault == "exit") _exit(3);
      if (fault == "skip") continue;
    }
    if (fault == "slow" && rank == fault_rank && it >= fault_iter) usleep(50000);
    ballast_comm_args a = args;
    if (fault == "other" && rank == fault_rank && it == fault_iter) {
      a.op = BALLAST_OP_BROADCAST;
      a.sendbuf = nullptr;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (in_flight == 1) {
      a.recvbuf = outs[0].data();
      if ((rc = api->run(comm, &a)) != BALLAST_OK) error = api->last_error(state);
    } else {
      std::vector<ballast_comm_request*> reqs;
      for (auto& out : outs) {
        a.recvbuf = out.data();
        ballast_comm_request* r = nullptr;
        if ((rc = api->start(comm, &a, &r)) != BALLAST_OK) {
          error = api->last_error(state);
          break;
        }
        reqs.push_back(r);
      }
      for (auto* r : reqs) {  // every request is waited for (and freed), the first failure kept
        const int w = api->wait(r);
        if (rc == BALLAST_OK && w != BALLAST_OK) {
          rc = w;
          error = api->last_error(state);
        }
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (it >= 0) lat.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  if (rc != BALLAST_OK) {
    std::fprintf(stderr, "comm_loop: rank %d: %s: %s\n", rank, ballast_status_name(rc), error.c_str());
    api->destroy(comm);
    return 1;
  }
  long bad = 0;
  for (const auto& buf : outs) {
    if (!check || op == BALLAST_OP_BARRIER) break;  // nothing to check
    const char* out = buf.data();
    for (uint64_t i = 0; i < out_elems; ++i) {
      double want = 0;
      if (op == BALLAST_OP_ALLREDUCE || op == BALLAST_OP_REDUCE) {
        if (op == BALLAST_OP_REDUCE && rank != 0) break;
        want = redop == BALLAST_RED_PROD ? 1 : redop == BALLAST_RED_SUM ? 0 : value(0, i);
        for (int r = 0; r < n; ++r) {
          const double x = value(r, i);
          want = redop == BALLAST_RED_SUM    ? want + x
                 : redop == BALLAST_RED_PROD ? want * x
                 : redop == BALLAST_RED_MIN  ? std::min(want, x)
                                             : std::max(want, x);
        }
        if (dtype == BALLAST_DT_U8) want = double(uint64_t(want) % 256);
      } else if (op == BALLAST_OP_BROADCAST) {
        want = value(0, i);
      } else if (op == BALLAST_OP_ALLGATHER) {
        want = value(int(i / count), i % count);
      } else if (op == BALLAST_OP_REDUCE_SCATTER) {
        want = 0;
        for (int r = 0; r < n; ++r) want += value(r, uint64_t(rank) * count + i);
        if (dtype == BALLAST_DT_U8) want = double(uint64_t(want) % 256);
      } else if (op == BALLAST_OP_ALLTOALL) {
        want = value(int(i / count), uint64_t(rank) * count + i % count);
      }
      if (load(out, uint32_t(dtype), i) != want && bad++ < 3)
        std::fprintf(stderr, "comm_loop: rank %d: element %llu is %g, expected %g\n", rank, (unsigned long long)i,
                     load(out, uint32_t(dtype), i), want);
    }
  }
  std::sort(lat.begin(), lat.end());
  if (rank == 0 && !lat.empty()) {
    double sum = 0;
    for (double x : lat) sum += x;
    const auto us = [](double v) { return std::round(v * 1000) / 1000; };
    const nlohmann::ordered_json j = {{"op", op_name},
                                      {"dtype", dtype_name},
                                      {"bytes", bytes},
                                      {"ranks", n},
                                      {"iters", iters},
                                      {"p50_us", us(lat[lat.size() / 2])},
                                      {"p99_us", us(lat[std::min(lat.size() - 1, lat.size() * 99 / 100)])},
                                      {"mean_us", us(sum / double(lat.size()))},
                                      {"check", check ? (bad ? "failed" : "passed") : "off"}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
  }
  api->destroy(comm);
  ballast_host_destroy(host);
  return bad ? 1 : 0;
}
