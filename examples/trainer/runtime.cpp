#include "runtime.hpp"

#include <time.h>

#include <cstdlib>
#include <stdexcept>

namespace trainer {

namespace {

std::string host_error(const char* what) { return std::string(what) + ": " + ballast_last_error(); }

}  // namespace

int64_t wall_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

Runtime::Runtime(const Options& o) {
  try {
    if (ballast_host_create(nullptr, &host_) != BALLAST_OK) throw std::runtime_error(host_error("ballast host"));
    if (ballast_host_load_plugin(host_, o.comm_plugin.c_str(), nullptr) != BALLAST_OK)
      throw std::runtime_error(host_error(("comm plugin " + o.comm_plugin).c_str()));
    if (ballast_host_load_plugin(host_, o.startup_plugin.c_str(), nullptr) != BALLAST_OK)
      throw std::runtime_error(host_error(("start-up plugin " + o.startup_plugin).c_str()));
    if (ballast_host_start(host_) != BALLAST_OK) throw std::runtime_error(host_error("ballast host start"));
    const void* table = nullptr;
    if (ballast_host_get_interface(host_, "comm-ucx", BALLAST_COMM_INTERFACE, BALLAST_COMM_VERSION, &table) !=
        BALLAST_OK)
      throw std::runtime_error(host_error("comm plugin"));
    comm_api_ = static_cast<const ballast_comm_api*>(table);
    if (ballast_host_get_interface(host_, "startup", BALLAST_STARTUP_INTERFACE, BALLAST_STARTUP_VERSION, &table) !=
        BALLAST_OK)
      throw std::runtime_error(host_error("start-up plugin"));
    startup_api_ = static_cast<const ballast_startup_api*>(table);

    // The tables' functions take the plugin's state; the embedding API hands
    // out the table alone, and both plugins accept NULL (no host to tell).
    ballast_comm_config cfg{};
    cfg.size = sizeof cfg;
    cfg.rank = -1;
    if (!std::getenv("RANK")) {  // standalone: a world of one
      cfg.rank = 0;
      cfg.nranks = 1;
    }
    cfg.timeout_ns = o.comm_timeout_ms * 1000000;
    const int64_t t0 = wall_ns();
    if (comm_api_->init(nullptr, &cfg, &comm_) != BALLAST_OK)
      throw CommError(std::string("comm init: ") + comm_api_->last_error(nullptr));
    stage("comm_init", t0, wall_ns(), 0);
    ballast_comm_info info{};
    info.size = sizeof info;
    comm_api_->info(comm_, &info);
    rank_ = info.rank;
    world_size_ = info.nranks;
  } catch (...) {
    if (comm_) comm_api_->destroy(comm_);
    ballast_host_destroy(host_);
    throw;
  }
}

Runtime::~Runtime() {
  if (comm_) comm_api_->destroy(comm_);
  ballast_host_destroy(host_);
}

void Runtime::allreduce_sum(float* data, uint64_t count) {
  ballast_comm_args a{};
  a.size = sizeof a;
  a.op = BALLAST_OP_ALLREDUCE;
  a.dtype = BALLAST_DT_F32;
  a.redop = BALLAST_RED_SUM;
  a.sendbuf = data;
  a.recvbuf = data;
  a.count = count;
  if (comm_api_->run(comm_, &a) != BALLAST_OK) throw CommError(comm_api_->last_error(nullptr));
}

Runtime::File::File(const ballast_startup_api* api, ballast_startup_file* file, std::string path)
    : api_(api), file_(file) {
  view_.path = std::move(path);
  uint64_t size = 0;
  view_.data = static_cast<const unsigned char*>(api->data(file, &size));
  view_.size = size;
  const uint32_t n = api->tensor_count(file);
  for (uint32_t i = 0; i < n; ++i) {
    ballast_startup_tensor t{};
    if (api->tensor(file, i, &t) != BALLAST_OK) continue;
    view_.tensors.push_back({t.name, t.dtype, std::vector<int64_t>(t.shape, t.shape + t.ndim), t.offset, t.bytes});
  }
}

Runtime::File::~File() { api_->release(nullptr, file_); }

std::unique_ptr<Runtime::File> Runtime::load(const std::string& path) {
  ballast_startup_file* f = nullptr;
  const int64_t t0 = wall_ns();
  if (startup_api_->load(nullptr, path.c_str(), nullptr, &f) != BALLAST_OK)
    throw std::runtime_error("checkpoint " + path + ": " + startup_api_->last_error(nullptr));
  auto file = std::make_unique<File>(startup_api_, f, path);
  stage("checkpoint_load", t0, wall_ns(), file->view().size);
  return file;
}

void Runtime::stage(const char* name, int64_t start_ns, int64_t end_ns, uint64_t bytes) {
  startup_api_->stage(nullptr, name, start_ns, end_ns, bytes, 0);
}

}  // namespace trainer
