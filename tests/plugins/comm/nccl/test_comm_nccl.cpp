// The NCCL comm plugin on a real GPU: a world of one rank per device in this
// process (one GPU is enough). Without a GPU the test reports itself skipped
// (exit 77): cudaGetDeviceCount failing is the signal.
#include <doctest/doctest.h>

#include <nccl_comm.hpp>

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace

TEST_CASE("allreduce, broadcast and allgather on device buffers, and a timeout-free run") {
  if (!have_gpu()) {
    MESSAGE("no CUDA device: skipped");
    std::exit(77);
  }
  const ballast_comm_api* api = ballast::comm_nccl::api();
  ballast_comm_config cfg{};
  cfg.size = sizeof cfg;
  cfg.rank = 0;
  cfg.nranks = 1;
  cfg.trace_dir = ".";
  ballast_comm* comm = nullptr;
  REQUIRE_MESSAGE(api->init(nullptr, &cfg, &comm) == BALLAST_OK, api->last_error(nullptr));
  const size_t count = 1 << 20;
  std::vector<float> host(count, 2.0f), back(count, 0.0f);
  float *in = nullptr, *out = nullptr;
  REQUIRE(cudaMalloc(&in, count * 4) == cudaSuccess);
  REQUIRE(cudaMalloc(&out, count * 4) == cudaSuccess);
  cudaMemcpy(in, host.data(), count * 4, cudaMemcpyHostToDevice);
  for (uint32_t op : {BALLAST_OP_ALLREDUCE, BALLAST_OP_BROADCAST, BALLAST_OP_ALLGATHER}) {
    ballast_comm_args a{};
    a.size = sizeof a;
    a.op = op;
    a.dtype = BALLAST_DT_F32;
    a.sendbuf = in;
    a.recvbuf = out;
    a.count = count;
    cudaMemset(out, 0, count * 4);
    ballast_comm_request* req = nullptr;
    REQUIRE_MESSAGE(api->start(comm, &a, &req) == BALLAST_OK, api->last_error(nullptr));
    CHECK_MESSAGE(api->wait(req) == BALLAST_OK, api->last_error(nullptr));
    cudaMemcpy(back.data(), out, count * 4, cudaMemcpyDeviceToHost);
    CHECK(back[0] == 2.0f);
    CHECK(back[count - 1] == 2.0f);
  }
  ballast_comm_info info{};
  info.size = sizeof info;
  CHECK(api->info(comm, &info) == BALLAST_OK);
  CHECK(info.seq == 3);
  cudaFree(in);
  cudaFree(out);
  api->destroy(comm);
}

TEST_CASE("init without a GPU or with a bad rank fails with a message") {
  if (!have_gpu()) std::exit(77);
  const ballast_comm_api* api = ballast::comm_nccl::api();
  ballast_comm_config cfg{};
  cfg.size = sizeof cfg;
  cfg.rank = 3;
  cfg.nranks = 2;
  ballast_comm* comm = nullptr;
  CHECK(api->init(nullptr, &cfg, &comm) == BALLAST_EINVAL);
  CHECK(std::string(api->last_error(nullptr)).find("invalid rank 3") != std::string::npos);
}
