// The trainer as a Ballast host (abi/ballast/host.h): an embedded libballast
// that loads the UCX comm plugin, whose collectives are traced into
// BALLAST_TRACE_DIR, and the start-up plugin, whose striped loader reads
// checkpoints back.
#pragma once

#include "checkpoint.hpp"

#include <ballast/comm.h>
#include <ballast/host.h>
#include <ballast/startup.h>

#include <cstdint>
#include <memory>
#include <string>

namespace trainer {

// A collective that failed (a peer died, stopped, left it out, or the
// deadline passed); the message is the comm plugin's root cause.
struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Runtime {
 public:
  struct Options {
    std::string comm_plugin = "comm-ucx";  // a path or a name in the plugin search path
    std::string startup_plugin = "startup";
    int64_t comm_timeout_ms = 0;  // 0: the plugin's (BALLAST_COMM_TIMEOUT_MS, else 300 s)
  };
  // Creates the host, loads and starts both plugins and joins the world
  // (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; without RANK, a world of
  // one). Throws with the plugin's or the host's message.
  explicit Runtime(const Options& options);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // In-place sum over every rank; throws CommError.
  void allreduce_sum(float* data, uint64_t count);

  // A safetensors file read with the start-up plugin's striped loader;
  // released when the handle goes.
  class File {
   public:
    File(const ballast_startup_api* api, ballast_startup_file* file, std::string path);
    ~File();
    File(const File&) = delete;
    File& operator=(const File&) = delete;
    const LoadedFile& view() const { return view_; }

   private:
    const ballast_startup_api* api_;
    ballast_startup_file* file_;
    LoadedFile view_;
  };
  std::unique_ptr<File> load(const std::string& path);

  // One stage of the start ("comm_init", "checkpoint_load", "first_step"),
  // through the start-up plugin's stage log. Wall-clock ns.
  void stage(const char* name, int64_t start_ns, int64_t end_ns, uint64_t bytes);

 private:
  ballast_host* host_ = nullptr;
  const ballast_comm_api* comm_api_ = nullptr;
  const ballast_startup_api* startup_api_ = nullptr;
  ballast_comm* comm_ = nullptr;
  int rank_ = 0, world_size_ = 1;
};

int64_t wall_ns();

}  // namespace trainer
