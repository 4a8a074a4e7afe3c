// For fuzz targets whose parser reads a file: the input as an anonymous
// in-memory file, reachable by descriptor and by /proc/self/fd path.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

class MemfdInput {
 public:
  MemfdInput(const uint8_t* data, size_t size) {
    fd_ = memfd_create("fuzz-input", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    for (size_t done = 0; done < size;) {
      ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += size_t(n);
    }
  }
  ~MemfdInput() { close(fd_); }
  MemfdInput(const MemfdInput&) = delete;
  MemfdInput& operator=(const MemfdInput&) = delete;

  int fd() const { return fd_; }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};
