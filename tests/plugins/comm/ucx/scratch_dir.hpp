// The test process's own folder for trace rings and other files its ranks
// leave: made under $TMPDIR (ctest gives each test one), named in
// BALLAST_TRACE_DIR for programs the test starts, and removed when the
// process that made it exits, so that runs leave nothing behind (not in
// /dev/shm either, the rings' default).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace test {

class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/ballast-comm-test-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) {
      std::perror(("scratch_dir.hpp: mkdtemp " + pattern).c_str());
      std::abort();
    }
    path_ = buf.data();
    owner_ = getpid();
    setenv("BALLAST_TRACE_DIR", path_.c_str(), 1);
  }
  ~ScratchDir() {
    if (getpid() != owner_) return;  // a forked rank that returned instead of _exit
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
  pid_t owner_ = 0;
};

// Made on first use (before any fork, so ranks share it).
inline const ScratchDir& scratch() {
  static const ScratchDir dir;
  return dir;
}

}  // namespace test
