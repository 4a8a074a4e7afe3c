// Every bench_* program answers --help with its usage and exits 0, and does
// nothing else: nothing is written to its working directory or to TMPDIR.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::vector<std::string> benches() {
  std::vector<std::string> names;
  std::stringstream list(BALLAST_BENCHES);
  for (std::string name; std::getline(list, name, ',');) names.push_back(name);
  return names;
}

struct Result {
  int status = -1;  // exit code; -1 when it had to be killed
  std::string out;
};

// Runs PROGRAM --help in dir (also its TMPDIR), stdout to a file there, for
// at most timeout_s: a benchmark that ignores --help would run for minutes.
Result run_help(const std::string& program, const fs::path& dir, const fs::path& out_file, int timeout_s) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (chdir(dir.c_str()) != 0) _exit(126);
    setenv("TMPDIR", dir.c_str(), 1);
    const int fd = open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) _exit(126);
    dup2(fd, 1);
    execl(program.c_str(), program.c_str(), "--help", static_cast<char*>(nullptr));
    _exit(127);
  }
  Result r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream in(out_file);
  r.out.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

}  // namespace

TEST_CASE("every bench_* program answers --help with its usage, exit 0, and writes nothing") {
  const auto names = benches();
  REQUIRE(names.size() >= 10);
  const fs::path root = fs::temp_directory_path() / ("bench-help-" + std::to_string(getpid()));
  for (const std::string& name : names) {
    CAPTURE(name);
    const fs::path work = root / name, out = root / (name + ".out");
    fs::create_directories(work);
    const Result r = run_help(std::string(BALLAST_BENCH_DIR) + "/" + name, work, out, 30);
    CAPTURE(r.out);
    CHECK(r.status == 0);
    CHECK((r.out.find("Usage:") != std::string::npos || r.out.find("usage:") != std::string::npos));
    std::vector<std::string> left;
    for (const auto& e : fs::recursive_directory_iterator(work)) left.push_back(e.path().string());
    CAPTURE(left);
    CHECK(left.empty());
  }
  fs::remove_all(root);
}
