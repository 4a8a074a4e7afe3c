// The progress line (plugins/common/progress.hpp): its text, silent on a
// pipe or with --json, drawn and erased on a real terminal (a pty), and
// `ballast launch` and `ballast startup load` showing it on a terminal only.
#include <doctest/doctest.h>

#include "progress.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

using ballast::util::progress_text;
using ballast::util::ProgressLine;

namespace {

// Everything readable from fd within timeout_ms of silence.
std::string drain(int fd, int timeout_ms) {
  std::string out;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, timeout_ms) == 1) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

// `ballast ARGS` with stdin, stdout and stderr on a new terminal (forkpty),
// or on a pipe; its output and exit code.
std::pair<std::string, int> run_ballast(const std::string& args, bool terminal) {
  int fd = -1, pipe_fds[2] = {-1, -1};
  pid_t pid;
  if (terminal) {
    pid = forkpty(&fd, nullptr, nullptr, nullptr);
  } else {
    REQUIRE(pipe(pipe_fds) == 0);
    pid = fork();
    if (pid == 0) {
      dup2(pipe_fds[1], 1);
      dup2(pipe_fds[1], 2);
    }
    fd = pipe_fds[0];
  }
  REQUIRE(pid >= 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", (std::string(BALLAST_EXE) + " " + args).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  if (!terminal) close(pipe_fds[1]);
  std::string out;
  int status = 0;
  for (;;) {
    out += drain(fd, 100);
    if (waitpid(pid, &status, WNOHANG) == pid) break;
  }
  out += drain(fd, 100);
  close(fd);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

}  // namespace

TEST_CASE("progress_text: done, total, percent, rate and time left") {
  CHECK(progress_text("load", 0, 100, 0, false) == "load: 0 of 100 (0%)");
  CHECK(progress_text("load", 30, 100, 3, false) == "load: 30 of 100 (30%), 10/s, 7 s left");
  CHECK(progress_text("prefetch", 1.5 * (1 << 30), 4.0 * (1 << 30), 2, true) ==
        "prefetch: 1.5 GiB of 4.0 GiB (37%), 805 MB/s, 4 s left");
  CHECK(progress_text("x", 512, 0, 1, true) == "x: 512 B, 0.0 MB/s");
  CHECK(progress_text("x", 10, 1000, 1, false) == "x: 10 of 1000 (1%), 10/s, 1 min 39 s left");
  CHECK(progress_text("x", 100, 100, 5, false) == "x: 100 of 100 (100%), 20/s");
}

TEST_CASE("ProgressLine: nothing on a pipe or a file, nothing with --json") {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::tmpfile(), &std::fclose);
  {
    ProgressLine line(f.get(), "load", true, false);
    CHECK_FALSE(line.active());
    line.update(1, 2);
    line.status("busy");
  }
  CHECK(std::ftell(f.get()) == 0);
  int master = -1, slave = -1;
  REQUIRE(openpty(&master, &slave, nullptr, nullptr, nullptr) == 0);
  std::FILE* tty = fdopen(slave, "w");
  {
    ProgressLine quiet(tty, "load", true, true);
    CHECK_FALSE(quiet.active());
    quiet.update(1, 2);
  }
  std::fflush(tty);
  CHECK(drain(master, 50).empty());
  std::fclose(tty);
  close(master);
}

TEST_CASE("ProgressLine: on a terminal, drawn in place and erased") {
  int master = -1, slave = -1;
  REQUIRE(openpty(&master, &slave, nullptr, nullptr, nullptr) == 0);
  std::FILE* tty = fdopen(slave, "w");
  {
    ProgressLine line(tty, "load", false, false);
    REQUIRE(line.active());
    line.update(10, 100);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    line.update(50, 100);
    line.update(60, 100);  // within 200 ms of the last: not drawn
  }
  const std::string out = drain(master, 100);
  CAPTURE(out);
  CHECK(out.find("\rload: 10 of 100 (10%)") == 0);
  CHECK(out.find("\rload: 50 of 100 (50%)") != std::string::npos);
  CHECK(out.find("60 of 100") == std::string::npos);
  CHECK(out.size() > 2);
  CHECK(out.substr(out.size() - 1) == "\r");  // erased at the end
  std::fclose(tty);
  close(master);
}

TEST_CASE("ballast launch shows its progress line on a terminal only") {
  const std::string args = "launch -n 2 -- sleep 1.5";
  const auto [tty_out, tty_rc] = run_ballast(args, true);
  CAPTURE(tty_out);
  CHECK(tty_rc == 0);
  CHECK(tty_out.find("ballast launch: 2 of 2 ranks running") != std::string::npos);
  const auto [pipe_out, pipe_rc] = run_ballast(args, false);
  CAPTURE(pipe_out);
  CHECK(pipe_rc == 0);
  CHECK(pipe_out.find("ranks running") == std::string::npos);
}

TEST_CASE("ballast startup load shows its progress line on a terminal only") {
  const auto file = std::filesystem::temp_directory_path() / ("ballast-progress-" + std::to_string(getpid()) + ".bin");
  std::ofstream(file) << std::string(4 << 20, 'x');
  const std::string args = "startup load --stripes 2 --chunk-mib 1 " + file.string();
  const auto [tty_out, tty_rc] = run_ballast(args, true);
  CAPTURE(tty_out);
  CHECK(tty_rc == 0);
  CHECK(tty_out.find("\rballast startup load: ") != std::string::npos);
  CHECK(tty_out.find(file.string() + ": ") != std::string::npos);  // the result line after it
  const auto [pipe_out, pipe_rc] = run_ballast(args, false);
  CAPTURE(pipe_out);
  CHECK(pipe_rc == 0);
  CHECK(pipe_out.find("ballast startup load:") == std::string::npos);
  const auto [json_out, json_rc] = run_ballast(args + " --json", true);
  CHECK(json_rc == 0);
  CHECK(json_out.find("ballast startup load:") == std::string::npos);
  std::filesystem::remove(file);
}
