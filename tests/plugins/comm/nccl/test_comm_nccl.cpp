// The NCCL comm plugin on a real GPU: a world of one rank per device in this
// process (one GPU is enough). Without a GPU the test reports itself skipped
// (exit 77): cudaGetDeviceCount failing is the signal.
#include <doctest/doctest.h>

#include <nccl_comm.hpp>
#include <trace_ring.hpp>

#include <ballast/events.h>
#include <ballast/host.h>

#include <cuda_runtime.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void require_gpu() {
  if (!have_gpu()) {
    MESSAGE("no CUDA device: skipped");
    std::exit(77);
  }
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A world of one on a port of its own.
ballast_comm* world(const ballast_comm_api* api, void* state = nullptr) {
  static int serial = 0;
  static const std::string dir = std::filesystem::temp_directory_path().string();
  ballast_comm_config cfg{};
  cfg.size = sizeof cfg;
  cfg.rank = 0;
  cfg.nranks = 1;
  cfg.master_port = 29000 + int(getpid() % 400) * 2 + serial++ % 2;
  cfg.trace_dir = dir.c_str();
  ballast_comm* comm = nullptr;
  REQUIRE_MESSAGE(api->init(state, &cfg, &comm) == BALLAST_OK, api->last_error(state));
  return comm;
}

// The state of record (comm, seq) in this process's ring once it is no
// longer running, or BALLAST_TRACE_STARTED if still running after limit_s.
uint32_t record_state(uint64_t comm_id, uint64_t seq, double limit_s, int32_t* status = nullptr) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  ballast::comm::TraceRing* ring = ballast::comm::TraceRing::current();
  REQUIRE(ring);
  while (true) {
    for (uint64_t i = ring->head(); i-- > 0 && ring->head() - i <= ring->capacity();) {
      ballast_trace_slot t;
      if (!ring->read(i, &t) || t.comm_id != comm_id || t.seq != seq) continue;
      if (t.state != BALLAST_TRACE_STARTED || std::chrono::steady_clock::now() > until) {
        if (status) *status = t.status;
        return t.state;
      }
      break;
    }
    usleep(1000);
  }
}

// Blocks a stream from the host until release() or a time limit, so that
// an operation enqueued behind it cannot start: a hang on one GPU.
struct StreamGate {
  std::atomic<bool> open{false};
  double limit_s;
  explicit StreamGate(cudaStream_t s, double limit = 5.0) : limit_s(limit) {
    REQUIRE(cudaLaunchHostFunc(s, &StreamGate::hold, this) == cudaSuccess);
  }
  static void hold(void* user) {
    auto* g = static_cast<StreamGate*>(user);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(g->limit_s);
    while (!g->open.load() && std::chrono::steady_clock::now() < until) usleep(1000);
  }
  void release() { open.store(true); }
};

// Whether the stream drained within limit_s.
bool drains(cudaStream_t s, double limit_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (cudaStreamQuery(s) == cudaErrorNotReady)
    if (std::chrono::steady_clock::now() > until) return false;
    else usleep(1000);
  return true;
}

// An in-place f32 sum allreduce of count floats at buf on stream s (NULL:
// the plugin's own stream).
ballast_comm_args allreduce_args(float* buf, uint64_t count, cudaStream_t s = nullptr) {
  ballast_comm_args a{};
  a.size = sizeof a;
  a.op = BALLAST_OP_ALLREDUCE;
  a.dtype = BALLAST_DT_F32;
  a.recvbuf = buf;
  a.count = count;
  a.stream = s;
  return a;
}

}  // namespace

TEST_CASE("allreduce, broadcast and allgather on device buffers, and a timeout-free run") {
  require_gpu();
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

TEST_CASE("the watchdog ends an operation nobody waits for, and the next start goes ahead") {
  require_gpu();
  const ballast_comm_api* api = ballast::comm_nccl::api();
  ballast_comm* comm = world(api);
  ballast_comm_info info{};
  info.size = sizeof info;
  REQUIRE(api->info(comm, &info) == BALLAST_OK);
  float* buf = nullptr;
  REQUIRE(cudaMalloc(&buf, 1024 * 4) == cudaSuccess);
  const ballast_comm_args a = allreduce_args(buf, 1024);
  ballast_comm_request* req = nullptr;
  REQUIRE_MESSAGE(api->start(comm, &a, &req) == BALLAST_OK, api->last_error(nullptr));
  CHECK(record_state(info.comm_id, 1, 10.0) == BALLAST_TRACE_DONE);  // no test() or wait() called
  CHECK_MESSAGE(api->start(comm, &a, &req) == BALLAST_OK, api->last_error(nullptr));
  CHECK(api->wait(req) == BALLAST_OK);
  cudaFree(buf);
  api->destroy(comm);
}

TEST_CASE("an operation that cannot start fails at its deadline: the watchdog aborts NCCL and the stream drains") {
  require_gpu();
  const ballast_comm_api* api = ballast::comm_nccl::api();
  ballast_comm* comm = world(api);
  ballast_comm_info info{};
  info.size = sizeof info;
  REQUIRE(api->info(comm, &info) == BALLAST_OK);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  float* buf = nullptr;
  REQUIRE(cudaMalloc(&buf, 1024 * 4) == cudaSuccess);
  StreamGate gate(s);
  ballast_comm_args a = allreduce_args(buf, 1024, s);
  a.timeout_ns = 200000000;  // 200 ms
  ballast_comm_request* req = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_MESSAGE(api->start(comm, &a, &req) == BALLAST_OK, api->last_error(nullptr));
  int32_t status = 0;
  CHECK(record_state(info.comm_id, 1, 3.0, &status) == BALLAST_TRACE_FAILED);  // no test() or wait() called
  CHECK(status == BALLAST_ETIMEDOUT);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  gate.release();
  CHECK(drains(s, 30.0));
  int done = 0;
  CHECK(api->test(req, &done) == BALLAST_ETIMEDOUT);
  CHECK(done == 1);
  const std::string m = api->last_error(nullptr);
  CHECK_MESSAGE(contains(m, "allreduce seq 1 on communicator"), m);
  CHECK_MESSAGE(contains(m, "timed out"), m);
  CHECK_MESSAGE(contains(m, "ncclCommAbort was called"), m);
  CHECK(api->start(comm, &a, &req) == BALLAST_ESTATE);
  CHECK(contains(api->last_error(nullptr), "failed earlier"));
  api->destroy(comm);
  cudaFree(buf);
  cudaStreamDestroy(s);
}

TEST_CASE("abort() from another thread ends the operation in flight with its reason") {
  require_gpu();
  const ballast_comm_api* api = ballast::comm_nccl::api();
  ballast_comm* comm = world(api);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  float* buf = nullptr;
  REQUIRE(cudaMalloc(&buf, 1024 * 4) == cudaSuccess);
  StreamGate gate(s);
  const ballast_comm_args a = allreduce_args(buf, 1024, s);
  ballast_comm_request* req = nullptr;
  REQUIRE_MESSAGE(api->start(comm, &a, &req) == BALLAST_OK, api->last_error(nullptr));
  std::thread other([&] {
    usleep(100000);
    api->abort(comm, "the launcher saw a peer die");
  });
  CHECK(api->wait(req) == BALLAST_EABORTED);
  CHECK(contains(api->last_error(nullptr), "the launcher saw a peer die"));
  other.join();
  gate.release();
  CHECK(drains(s, 30.0));
  CHECK(api->start(comm, &a, &req) == BALLAST_EABORTED);
  api->destroy(comm);
  cudaFree(buf);
  cudaStreamDestroy(s);
}

TEST_CASE("with a host, the plugin's operations arrive on the bus as collective.record") {
  require_gpu();
  const std::string path = std::string(BALLAST_PLUGIN_DIR) + "/ballast-comm-nccl.so";
  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("test", &host) == BALLAST_OK);
  REQUIRE_MESSAGE(ballast_host_load_plugin(host, path.c_str(), "{ publish_period_seconds = 0.02 }") == BALLAST_OK,
                  ballast_last_error());
  std::mutex mu;
  std::vector<uint64_t> seqs;
  auto on_record = [](void* user, const ballast_event* e) {
    auto* seen = static_cast<std::pair<std::mutex*, std::vector<uint64_t>*>*>(user);
    if (std::string(e->topic) != "collective.record") return 0;
    std::lock_guard<std::mutex> lock(*seen->first);
    seen->second->push_back(static_cast<const ballast_collective_record*>(e->payload)->seq);
    return 0;
  };
  std::pair<std::mutex*, std::vector<uint64_t>*> seen{&mu, &seqs};
  uint64_t sub = 0;
  REQUIRE(ballast_host_subscribe(host, "collective.*", nullptr, on_record, &seen, &sub) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);
  const void* table = nullptr;
  REQUIRE(ballast_host_get_interface(host, "comm-nccl", BALLAST_COMM_INTERFACE, BALLAST_COMM_VERSION, &table) == BALLAST_OK);
  const auto* api = static_cast<const ballast_comm_api*>(table);
  ballast_comm* comm = world(api);
  float* buf = nullptr;
  REQUIRE(cudaMalloc(&buf, 1024 * 4) == cudaSuccess);
  const ballast_comm_args a = allreduce_args(buf, 1024);
  for (int i = 0; i < 3; ++i) REQUIRE_MESSAGE(api->run(comm, &a) == BALLAST_OK, api->last_error(nullptr));
  for (int i = 0; i < 100; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (seqs.size() >= 3) break;
    }
    usleep(20000);
  }
  api->destroy(comm);
  cudaFree(buf);
  ballast_host_destroy(host);
  CHECK(seqs == std::vector<uint64_t>{1, 2, 3});
}
