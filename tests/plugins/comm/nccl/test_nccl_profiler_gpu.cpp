// The stand-alone NCCL profiler plugin loaded by NCCL itself
// (NCCL_PROFILER_PLUGIN), for communicators created directly with NCCL, not
// through Ballast: each operation recorded in the process's ring. With two
// GPUs, a rank that skips a collective is named by the hang analysis.
// Without a GPU the test reports itself skipped (exit 77). It has not yet
// run on a GPU.
#include <doctest/doctest.h>

#include <analysis.hpp>
#include <rings.hpp>

#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

void require_gpu() {
  if (gpus() == 0) {
    MESSAGE("no CUDA device: skipped");
    std::exit(77);
  }
}

std::string fresh_dir(const std::string& name) {
  const std::string d = fs::temp_directory_path() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// This process's environment as a job under the profiler: before NCCL's
// first communicator, which reads NCCL_PROFILER_PLUGIN.
void use_profiler(const std::string& dir, int rank, int n) {
  setenv("NCCL_PROFILER_PLUGIN", (std::string(BALLAST_BINARY_DIR) + "/lib/ballast/ballast-nccl-profiler.so").c_str(),
         1);
  setenv("BALLAST_TRACE_DIR", dir.c_str(), 1);
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
}

}  // namespace

TEST_CASE("communicators made directly with NCCL: every operation of each recorded and ended") {
  require_gpu();
  const std::string dir = fresh_dir("nccl-profiler-gpu");
  const pid_t pid = fork();  // a process of its own: NCCL reads the variable once
  if (pid == 0) {
    use_profiler(dir, 0, 1);
    int dev = 0;
    ncclComm_t comms[2];
    if (ncclCommInitAll(&comms[0], 1, &dev) != ncclSuccess || ncclCommInitAll(&comms[1], 1, &dev) != ncclSuccess)
      _exit(3);
    float* buf = nullptr;
    cudaStream_t s;
    if (cudaMalloc(&buf, 1 << 20) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess) _exit(4);
    for (int i = 0; i < 5; ++i)
      for (ncclComm_t c : comms)
        if (ncclAllReduce(buf, buf, 1 << 18, ncclFloat32, ncclSum, c, s) != ncclSuccess) _exit(5);
    if (cudaStreamSynchronize(s) != cudaSuccess) _exit(6);
    usleep(200000);  // the proxy thread reports the kernels' ends
    for (ncclComm_t c : comms) ncclCommDestroy(c);
    _exit(0);
  }
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  std::vector<std::string> errors;
  const auto rings = ballast::hang::read_dir(dir, &errors);
  CHECK(errors.empty());
  REQUIRE(rings.size() == 1);
  CHECK(rings[0].path.find(".ncclprof.btrace") != std::string::npos);
  CHECK(rings[0].header.closed == 1);
  std::vector<uint64_t> comm_ids;
  for (const auto& s : rings[0].records) {
    CHECK(s.op == BALLAST_OP_ALLREDUCE);
    CHECK(s.count == (1u << 18));
    CHECK(s.state == BALLAST_TRACE_DONE);
    if (std::find(comm_ids.begin(), comm_ids.end(), s.comm_id) == comm_ids.end()) comm_ids.push_back(s.comm_id);
  }
  CHECK(rings[0].records.size() == 10);
  CHECK(comm_ids.size() == 2);
  CHECK(ballast::hang::analyze(rings, {}).verdict == "healthy");
}

TEST_CASE("two GPUs: a rank that skips an allreduce is named not_joined from the profiler's rings") {
  require_gpu();
  if (gpus() < 2) {
    MESSAGE("one GPU: the two-rank case is skipped");
    return;
  }
  const std::string dir = fresh_dir("nccl-profiler-gpu-hang");
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      use_profiler(dir, r, 2);
      cudaSetDevice(r);
      ncclComm_t comm;
      if (ncclCommInitRank(&comm, 2, id, r) != ncclSuccess) _exit(3);
      float* buf = nullptr;
      cudaStream_t s;
      if (cudaMalloc(&buf, 1 << 20) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess) _exit(4);
      for (int i = 0; i < 4; ++i) {
        if (r == 1 && i == 3) break;  // rank 1 skips the fourth
        ncclAllReduce(buf, buf, 1 << 18, ncclFloat32, ncclSum, comm, s);
      }
      if (r == 1) cudaStreamSynchronize(s);
      const char one = 1;
      if (write(ready[1], &one, 1) != 1) _exit(5);
      for (;;) pause();
    }
    pids.push_back(pid);
  }
  for (int r = 0; r < 2; ++r) {
    char c = 0;
    REQUIRE(read(ready[0], &c, 1) == 1);
  }
  sleep(2);  // rank 0's fourth allreduce waits on the GPU
  std::vector<std::string> errors;
  const auto v = ballast::hang::analyze(ballast::hang::read_dir(dir, &errors), {});
  for (pid_t pid : pids) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  INFO(v.to_text());
  CHECK(v.verdict == "hang");
  CHECK(v.seq == 4);
  REQUIRE(!v.causes.empty());
  CHECK(v.causes[0].rank == 1);
  CHECK(v.causes[0].kind == "not_joined");
}
