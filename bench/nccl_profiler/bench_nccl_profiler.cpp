// The stand-alone NCCL profiler's cost per operation, without a GPU: its
// callbacks driven as NCCL calls them for one collective (the enqueue event
// on the caller's thread: start and stop; then on NCCL's proxy thread: the
// kernel's channels started and stopped), against the same calls into an
// empty profiler table (the ceiling: what NCCL's indirect calls cost alone).
// CPU time of the calling thread, ns per operation (each side timed around
// its calls, so the clock reads count in both), median of the runs.
#include "command_line.hpp"

#include <nccl_profiler_v5.h>

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

double cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}

ncclResult_t noop_init(void** c, uint64_t, int* mask, const char*, int, int, int, ballast_nccl_logger) {
  static int dummy;
  *c = &dummy;
  *mask = ~0;
  return ncclSuccess;
}
ncclResult_t noop_start(void*, void** h, ballast_nccl_prof_descr_v5*) {
  static int dummy;
  *h = &dummy;
  return ncclSuccess;
}
ncclResult_t noop_stop(void*) { return ncclSuccess; }
ncclResult_t noop_state(void*, int, ballast_nccl_prof_state_args_v5*) { return ncclSuccess; }
ncclResult_t noop_finalize(void*) { return ncclSuccess; }
const ballast_nccl_profiler_v5 kNoop = {"noop", noop_init, noop_start, noop_stop, noop_state, noop_finalize};

struct Costs {
  double enqueue_ns, kernel_ns;
};

// ops operations of `channels` channels each, through profiler p, in
// batches of `batch`: the batch enqueued (the caller's side), then its
// kernels run (NCCL's proxy thread's side), as a trainer enqueues buckets
// ahead of the GPU; each side's batch timed as a whole (the thread CPU clock
// is a system call here, about 0.7 us).
Costs run(const ballast_nccl_profiler_v5* p, int ops, int channels, int batch) {
  void* ctx = nullptr;
  int mask = 0;
  p->init(&ctx, 0xbe4c, &mask, "bench-comm", 1, 8, 0, nullptr);
  ballast_nccl_prof_descr_v5 coll{};
  coll.type = NCCL_PROF_COLL;
  coll.coll.func = "AllReduce";
  coll.coll.count = 1 << 20;
  coll.coll.datatype = "ncclBfloat16";
  coll.coll.nChannels = uint8_t(channels);
  std::vector<void*> handles(static_cast<size_t>(batch));
  double caller = 0, proxy = 0;
  for (int done = 0; done < ops; done += batch) {
    const double t0 = cpu_ns();
    for (int i = 0; i < batch; ++i) {
      void* h = nullptr;
      p->startEvent(ctx, &h, &coll);
      p->stopEvent(h);
      handles[size_t(i)] = h;
    }
    const double t1 = cpu_ns();
    for (int i = 0; i < batch; ++i) {
      ballast_nccl_prof_descr_v5 k{};
      k.type = NCCL_PROF_KERNEL_CH;
      k.parentObj = handles[size_t(i)];
      void* ch[64];
      for (int c = 0; c < channels; ++c) {
        k.kernelCh.channelId = uint8_t(c);
        p->startEvent(ctx, &ch[c], &k);
      }
      for (int c = 0; c < channels; ++c) p->stopEvent(ch[c]);
    }
    const double t2 = cpu_ns();
    caller += t1 - t0;
    proxy += t2 - t1;
  }
  p->finalize(ctx);
  const int n = ops / batch * batch;
  return {caller / n, proxy / n};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void line(const char* c, const char* metric, double value, const char* unit) {
  std::printf("{\"bench\":\"nccl_profiler\",\"case\":\"%s\",\"metric\":\"%s\",\"value\":%.4g,\"unit\":\"%s\"}\n", c,
              metric, value, unit);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 9, ops = 200000;
  bool quick = false;
  CLI::App app(
      "The stand-alone NCCL profiler's cost per operation, without a GPU, against an empty profiler table; "
      "JSON lines on stdout.",
      "bench_nccl_profiler");
  app.add_option("--runs", runs, "runs (the median is reported; default 9)")->check(CLI::PositiveNumber);
  app.add_flag("--quick", quick, "a tenth of the operations, 3 runs");
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  if (quick) {
    ops = 20000;
    if (app.count("--runs") == 0) runs = 3;
  }
  const std::string dir = std::filesystem::temp_directory_path() / ("bench-nccl-profiler-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  setenv("BALLAST_TRACE_DIR", dir.c_str(), 1);
  void* so = dlopen(BENCH_PROFILER_SO, RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    std::fprintf(stderr, "bench_nccl_profiler: %s\n", dlerror());
    return 1;
  }
  const auto* prof = static_cast<const ballast_nccl_profiler_v5*>(dlsym(so, "ncclProfiler_v5"));
  for (const int channels : {2, 16}) {
    std::vector<double> enq, ker, enq0, ker0;
    for (int r = 0; r < runs; ++r) {
      const Costs b = run(prof, ops, channels, 32), n = run(&kNoop, ops, channels, 32);
      enq.push_back(b.enqueue_ns);
      ker.push_back(b.kernel_ns);
      enq0.push_back(n.enqueue_ns);
      ker0.push_back(n.kernel_ns);
    }
    const std::string c = "allreduce_" + std::to_string(channels) + "ch";
    line(c.c_str(), "caller_ns_per_op", median(enq), "ns");
    line(c.c_str(), "caller_ns_per_op_empty_profiler", median(enq0), "ns");
    line(c.c_str(), "proxy_ns_per_op", median(ker), "ns");
    line(c.c_str(), "proxy_ns_per_op_empty_profiler", median(ker0), "ns");
  }
  std::filesystem::remove_all(dir);
  return 0;
}
