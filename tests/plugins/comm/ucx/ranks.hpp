// Runs a function in N forked processes ("ranks") and collects their exit
// codes; a rank still running at the deadline is killed and reported as -1.
#pragma once

#include <ucx_comm.hpp>

#include "scratch_dir.hpp"
#include "test_ports.hpp"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace test {

// In the test process's scratch folder (made before any fork): test
// executables run side by side under ctest -j.
inline const std::string kErrPrefix = scratch() / "rank-";
// The ranks' trace rings, emptied per run_ranks.
inline const std::string kTraceDir = scratch() / "traces";
inline std::string err_path(int rank) { return kErrPrefix + std::to_string(rank) + ".err"; }

inline std::string read_err(int rank) {
  std::ifstream f(err_path(rank));
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The exit code for a failing status: 10 + (-status).
inline int fail_code(int status) { return 10 - status; }

inline int child_fail(int rank, int status, const std::string& msg) {
  std::ofstream(err_path(rank)) << msg;
  return fail_code(status);
}

struct Result {
  std::vector<int> codes;  // exit code, 128+signal, or -1 when killed at the deadline
  double seconds = 0;
};

// fn(rank) returns the exit code. UCX_TLS is set for the children.
inline Result run_ranks(int n, const char* tls, double timeout_s, const std::function<int(int)>& fn,
                        const std::function<void(std::vector<pid_t>&)>& while_running = nullptr) {
  setenv("UCX_TLS", tls, 1);
  for (int r = 0; r < n; ++r) std::remove(err_path(r).c_str());
  std::filesystem::remove_all(kTraceDir);
  std::filesystem::create_directories(kTraceDir);
  std::vector<pid_t> pids;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 99;
      code = fn(r);
      _exit(code);
    }
    pids.push_back(pid);
  }
  if (while_running) while_running(pids);
  Result res;
  res.codes.assign(size_t(n), -2);
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (res.codes[size_t(r)] != -2) continue;
      int st = 0;
      if (waitpid(pids[size_t(r)], &st, WNOHANG) == pids[size_t(r)]) {
        res.codes[size_t(r)] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (left > 0 && el > timeout_s) {
      for (int r = 0; r < n; ++r)
        if (res.codes[size_t(r)] == -2) {
          kill(pids[size_t(r)], SIGKILL);
          waitpid(pids[size_t(r)], nullptr, 0);
          res.codes[size_t(r)] = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

// The arguments of a summing operation.
inline ballast_comm_args args_of(uint32_t op, const void* in, void* out, uint64_t count,
                                 uint32_t dtype = BALLAST_DT_F32, int root = 0) {
  ballast_comm_args a{};
  a.size = sizeof a;
  a.op = op;
  a.dtype = dtype;
  a.redop = BALLAST_RED_SUM;
  a.sendbuf = in;
  a.recvbuf = out;
  a.count = count;
  a.root = root;
  return a;
}

inline ballast_comm_config config(int rank, int n, int port, int64_t timeout_ms) {
  ballast_comm_config c{};
  c.size = sizeof c;
  c.rank = rank;
  c.nranks = n;
  c.master_addr = "127.0.0.1";
  c.master_port = port;
  c.timeout_ns = timeout_ms * 1000000;
  c.trace_dir = kTraceDir.c_str();
  return c;
}

}  // namespace test
