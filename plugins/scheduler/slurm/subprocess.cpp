#include "subprocess.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

extern char** environ;

namespace ballast::slurm {

bool run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env, int timeout_ms,
                 CommandResult* result, std::string* error, size_t max_output) {
  *result = CommandResult{};
  if (argv.empty()) {
    *error = "run_command: empty command";
    return false;
  }
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    *error = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  for (const auto& e : env) {
    std::string name = e.substr(0, e.find('=') + 1);
    std::erase_if(envs, [&](const std::string& x) { return x.rfind(name, 0) == 0; });
    envs.push_back(e);
  }
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    execvpe(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    *error = std::string("fork: ") + std::strerror(errno);
    return false;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  pollfd p[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&result->out, &result->err};
  int open_fds = 2;
  bool timed_out = false;
  while (open_fds > 0) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0) {
      timed_out = true;
      break;
    }
    if (poll(p, 2, left) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      ssize_t n = read(p[i].fd, buf, sizeof buf);
      if (n <= 0) {
        close(p[i].fd);
        p[i].fd = -1;
        --open_fds;
      } else if (sinks[i]->size() < max_output) {
        sinks[i]->append(buf, std::min(static_cast<size_t>(n), max_output - sinks[i]->size()));
      }
    }
  }
  for (auto& q : p)
    if (q.fd >= 0) close(q.fd);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  result->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (timed_out) {
    *error = argv[0] + ": timed out after " + std::to_string(timeout_ms) + " ms";
    return false;
  }
  if (result->exit_code == 127 && result->out.empty() && result->err.empty()) {
    *error = argv[0] + ": not found";
    return false;
  }
  return true;
}

}  // namespace ballast::slurm
