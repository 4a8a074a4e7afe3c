// The NCCL comm plugin on a real GPU: a world of one rank per device in this
// process (one GPU is enough). Without a GPU the test reports itself skipped
// (exit 77): cudaGetDeviceCount failing is the signal.
#include "test_ports.hpp"

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
  static const std::string dir = std::filesystem::temp_directory_path().string();
  ballast_comm_config cfg{};
  cfg.size = sizeof cfg;
  cfg.rank = 0;
  cfg.nranks = 1;
  cfg.master_port = test::reserve_ports(1);
  cfg.trace_dir = dir.c_str();
  ballast_comm* comm = nullptr;
  REQUIRE_MESSAGE(api->init(state, &cfg, &comm) == BALLAST_OK, api->last_error(state));
  return comm;
}

// Record (comm, seq) of this process's ring once it has ended (done or
// failed), or as it is after limit_s (issued or started). The record must
// be in the ring.
ballast_trace_slot record(uint64_t comm_id, uint64_t seq, double limit_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  ballast::comm::TraceRing* ring = ballast::comm::TraceRing::current();
  REQUIRE(ring);
  while (true) {
    ballast_trace_slot t{};
    bool found = false;
    for (uint64_t i = ring->head(); !found && i-- > 0 && ring->head() - i <= ring->capacity();)
      found = ring->read(i, &t) && t.comm_id == comm_id && t.seq == seq;
    const bool ended = found && (t.state == BALLAST_TRACE_DONE || t.state == BALLAST_TRACE_FAILED);
    if (ended || std::chrono::steady_clock::now() > until) {
      REQUIRE_MESSAGE(found, "no record of seq " << seq);
      return t;
    }
    usleep(1000);
  }
}

uint32_t record_state(uint64_t comm_id, uint64_t seq, double limit_s, int32_t* status = nullptr) {
  const ballast_trace_slot t = record(comm_id, seq, limit_s);
  if (status) *status = t.status;
  return t.state;
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
    if (std::chrono::steady_clock::now() > until)
      return false;
    else
      usleep(1000);
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

// A world of one (its info read), a stream of the test's own and a device
// buffer of 1024 floats; torn down in the reverse order.
struct Gpu {
  const ballast_comm_api* api = ballast::comm_nccl::api();
  ballast_comm* comm = nullptr;
  ballast_comm_info info{};
  cudaStream_t stream = nullptr;
  float* buf = nullptr;

  Gpu() {
    require_gpu();
    comm = world(api);
    info.size = sizeof info;
    REQUIRE(api->info(comm, &info) == BALLAST_OK);
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaMalloc(&buf, 1024 * 4) == cudaSuccess);
  }
  ~Gpu() {
    api->destroy(comm);
    cudaFree(buf);
    cudaStreamDestroy(stream);
  }
};

TEST_CASE("the watchdog ends an operation nobody waits for, and the next start goes ahead") {
  Gpu g;
  const ballast_comm_args a = allreduce_args(g.buf, 1024);
  ballast_comm_request* req = nullptr;
  REQUIRE_MESSAGE(g.api->start(g.comm, &a, &req) == BALLAST_OK, g.api->last_error(nullptr));
  CHECK(record_state(g.info.comm_id, 1, 10.0) == BALLAST_TRACE_DONE);  // no test() or wait() called
  ballast_comm_request* next = nullptr;
  CHECK_MESSAGE(g.api->start(g.comm, &a, &next) == BALLAST_OK, g.api->last_error(nullptr));
  CHECK(g.api->wait(next) == BALLAST_OK);
  int done = 0;
  CHECK(g.api->test(req, &done) == BALLAST_OK);  // still the caller's to collect
  CHECK(done == 1);
}

TEST_CASE("several operations in flight: each request reports its own, collected in any order") {
  Gpu g;
  CHECK(g.info.max_in_flight == 64);
  const size_t count = 4096;
  float* in = nullptr;
  float* out = nullptr;
  REQUIRE(cudaMalloc(&in, 3 * count * 4) == cudaSuccess);
  REQUIRE(cudaMalloc(&out, 3 * count * 4) == cudaSuccess);
  std::vector<float> host(3 * count);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i / count + 1);  // 1, 2, 3 per operation
  cudaMemcpy(in, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(out, 0, 3 * count * 4);
  StreamGate gate(g.stream);
  ballast_comm_request* req[3] = {};
  for (int k = 0; k < 3; ++k) {
    ballast_comm_args a = allreduce_args(out + k * count, count, g.stream);
    a.sendbuf = in + k * count;
    REQUIRE_MESSAGE(g.api->start(g.comm, &a, &req[k]) == BALLAST_OK, g.api->last_error(nullptr));
  }
  int done = 1;
  CHECK(g.api->test(req[0], &done) == BALLAST_OK);
  CHECK(done == 0);  // held behind the gate
  // The first runs (its kernels wait on the stream); the others are queued behind it.
  CHECK(record_state(g.info.comm_id, 1, 0.05) == BALLAST_TRACE_STARTED);
  for (uint64_t seq = 2; seq <= 3; ++seq) {
    const ballast_trace_slot t = record(g.info.comm_id, seq, 0.0);
    CHECK(t.state == BALLAST_TRACE_ISSUED);
    CHECK(t.start_tick == 0);
  }
  gate.release();
  CHECK(g.api->wait(req[2]) == BALLAST_OK);
  CHECK(g.api->wait(req[0]) == BALLAST_OK);
  for (int i = 0; i < 10000 && done == 0; ++i) CHECK(g.api->test(req[1], &done) == BALLAST_OK);
  CHECK(done == 1);
  std::vector<float> back(3 * count);
  cudaMemcpy(back.data(), out, back.size() * 4, cudaMemcpyDeviceToHost);
  CHECK(back == host);
  uint64_t previous_end = 0;
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    const ballast_trace_slot t = record(g.info.comm_id, seq, 5.0);
    CHECK(t.state == BALLAST_TRACE_DONE);
    CHECK(t.start_tick >= previous_end);  // each started once the one before it was seen done
    CHECK(t.end_tick >= t.start_tick);
    previous_end = t.end_tick;
  }
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("start past max_in_flight returns EFULL; collecting one makes room") {
  Gpu g;
  StreamGate gate(g.stream);
  const ballast_comm_args a = allreduce_args(g.buf, 1024, g.stream);
  std::vector<ballast_comm_request*> reqs(64);
  for (auto& r : reqs) REQUIRE_MESSAGE(g.api->start(g.comm, &a, &r) == BALLAST_OK, g.api->last_error(nullptr));
  ballast_comm_request* extra = nullptr;
  CHECK(g.api->start(g.comm, &a, &extra) == BALLAST_EFULL);
  CHECK_MESSAGE(contains(g.api->last_error(nullptr), "64 operations"), g.api->last_error(nullptr));
  gate.release();
  CHECK(g.api->wait(reqs[0]) == BALLAST_OK);
  CHECK_MESSAGE(g.api->start(g.comm, &a, &reqs[0]) == BALLAST_OK, g.api->last_error(nullptr));
  for (auto* r : reqs) CHECK(g.api->wait(r) == BALLAST_OK);
}

TEST_CASE("when one operation in flight fails, the others fail with its cause") {
  Gpu g;
  StreamGate gate(g.stream);
  ballast_comm_args first = allreduce_args(g.buf, 1024, g.stream);
  first.timeout_ns = 200000000;  // 200 ms; the second keeps the communicator's 300 s
  const ballast_comm_args second = allreduce_args(g.buf, 1024, g.stream);
  ballast_comm_request* r1 = nullptr;
  ballast_comm_request* r2 = nullptr;
  REQUIRE_MESSAGE(g.api->start(g.comm, &first, &r1) == BALLAST_OK, g.api->last_error(nullptr));
  REQUIRE_MESSAGE(g.api->start(g.comm, &second, &r2) == BALLAST_OK, g.api->last_error(nullptr));
  int32_t status = 0;
  CHECK(record_state(g.info.comm_id, 2, 3.0, &status) == BALLAST_TRACE_FAILED);  // the watchdog, nobody waiting
  CHECK(status == BALLAST_ETIMEDOUT);
  gate.release();
  CHECK(drains(g.stream, 30.0));
  CHECK(g.api->wait(r2) == BALLAST_ETIMEDOUT);
  const std::string m = g.api->last_error(nullptr);
  CHECK_MESSAGE(contains(m, "allreduce seq 2 on communicator"), m);
  CHECK_MESSAGE(contains(m, "did not complete: allreduce seq 1"), m);
  CHECK_MESSAGE(contains(m, "timed out"), m);
  CHECK(g.api->wait(r1) == BALLAST_ETIMEDOUT);
  CHECK(record_state(g.info.comm_id, 1, 1.0) == BALLAST_TRACE_FAILED);
  CHECK(record(g.info.comm_id, 2, 1.0).start_tick == 0);  // failed while queued: never started
}

TEST_CASE("an operation that cannot start fails at its deadline: the watchdog aborts NCCL and the stream drains") {
  Gpu g;
  StreamGate gate(g.stream);
  ballast_comm_args a = allreduce_args(g.buf, 1024, g.stream);
  a.timeout_ns = 200000000;  // 200 ms
  ballast_comm_request* req = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_MESSAGE(g.api->start(g.comm, &a, &req) == BALLAST_OK, g.api->last_error(nullptr));
  int32_t status = 0;
  CHECK(record_state(g.info.comm_id, 1, 3.0, &status) == BALLAST_TRACE_FAILED);  // no test() or wait() called
  CHECK(status == BALLAST_ETIMEDOUT);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  gate.release();
  CHECK(drains(g.stream, 30.0));
  int done = 0;
  CHECK(g.api->test(req, &done) == BALLAST_ETIMEDOUT);
  CHECK(done == 1);
  const std::string m = g.api->last_error(nullptr);
  CHECK_MESSAGE(contains(m, "allreduce seq 1 on communicator"), m);
  CHECK_MESSAGE(contains(m, "timed out"), m);
  CHECK_MESSAGE(contains(m, "ncclCommAbort was called"), m);
  CHECK(g.api->start(g.comm, &a, &req) == BALLAST_ESTATE);
  CHECK(contains(g.api->last_error(nullptr), "failed earlier"));
}

TEST_CASE("abort() from another thread ends the operation in flight with its reason") {
  Gpu g;
  StreamGate gate(g.stream);
  const ballast_comm_args a = allreduce_args(g.buf, 1024, g.stream);
  ballast_comm_request* req = nullptr;
  REQUIRE_MESSAGE(g.api->start(g.comm, &a, &req) == BALLAST_OK, g.api->last_error(nullptr));
  std::thread other([&] {
    usleep(100000);
    g.api->abort(g.comm, "the launcher saw a peer die");
  });
  CHECK(g.api->wait(req) == BALLAST_EABORTED);
  CHECK(contains(g.api->last_error(nullptr), "the launcher saw a peer die"));
  other.join();
  gate.release();
  CHECK(drains(g.stream, 30.0));
  CHECK(g.api->start(g.comm, &a, &req) == BALLAST_EABORTED);
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
  REQUIRE(ballast_host_get_interface(host, "comm-nccl", BALLAST_COMM_INTERFACE, BALLAST_COMM_VERSION, &table) ==
          BALLAST_OK);
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
