// Runs build/bin/ballast-trainer (alone, or as N ranks under the real
// `ballast launch`) with extra environment, its output captured, for the
// trainer's tests.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace test {

inline const std::string kTrainer = std::string(BALLAST_BINARY_DIR) + "/bin/ballast-trainer";
inline const std::string kBallast = BALLAST_EXE;

// A fresh folder under $TMPDIR (ctest gives each test its own).
inline std::string fresh_dir(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/trainer-" + std::to_string(getpid()) + "-" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

struct Process {
  pid_t pid = -1;
  std::string out_path, err_path;
};

struct Result {
  int code = -1;  // exit status, or 128 + signal
  std::string out, err;
};

// Starts argv with `env` added (an empty value unsets the variable); stdout
// and stderr go to files in `dir`.
inline Process start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                     const std::string& dir, const std::string& tag) {
  Process p;
  p.out_path = dir + "/" + tag + ".out";
  p.err_path = dir + "/" + tag + ".err";
  std::fflush(stdout);
  std::fflush(stderr);
  p.pid = fork();
  if (p.pid == 0) {
    const int fo = open(p.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int fe = open(p.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fo, 1);
    dup2(fe, 2);
    for (const auto& [k, v] : env) {
      if (v.empty())
        unsetenv(k.c_str());
      else
        setenv(k.c_str(), v.c_str(), 1);
    }
    // In sanitizer builds LeakSanitizer's exit-time tracer trips over UCX's
    // threads (see tests/plugins/detector/hang): ranks run without it.
    const char* asan = std::getenv("ASAN_OPTIONS");
    setenv("ASAN_OPTIONS", (asan && *asan ? std::string(asan) + ":detect_leaks=0" : "detect_leaks=0").c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::perror("execv");
    _exit(127);
  }
  return p;
}

inline std::string slurp(const std::string& path) {
  std::stringstream s;
  s << std::ifstream(path).rdbuf();
  return s.str();
}

// Waits for p (SIGKILL after timeout_s) and collects its output.
inline Result finish(const Process& p, double timeout_s = 120) {
  int st = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (waitpid(p.pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(p.pid, SIGKILL);
      waitpid(p.pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(p.out_path);
  r.err = slurp(p.err_path);
  return r;
}

// The trainer alone (a world of one, unsupervised unless env says otherwise).
inline Result trainer(const std::vector<std::string>& args, const std::string& dir,
                      std::map<std::string, std::string> env = {}) {
  std::vector<std::string> argv{kTrainer};
  argv.insert(argv.end(), args.begin(), args.end());
  for (const char* k : {"RANK", "WORLD_SIZE", "BALLAST_JOB_SOCKET", "BALLAST_CONTROL_FILE", "BALLAST_INJECT",
                        "BALLAST_CHECKPOINT_DIR", "BALLAST_RESUME_FROM"})
    env.emplace(k, "");
  env.emplace("BALLAST_TRACE_DIR", dir);
  return finish(start(argv, env, dir, "trainer"));
}

// `ballast launch -n N -- ballast-trainer ARGS`.
inline std::vector<std::string> launch_argv(int ranks, const std::string& trace_dir,
                                            const std::vector<std::string>& args) {
  std::vector<std::string> argv{kBallast,      "launch",  "-n", std::to_string(ranks),
                                "--trace-dir", trace_dir, "--", kTrainer};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

}  // namespace test
