// The job of bench/startup: starts the way a training process does.
//   bench_startup_job --imports LIST [--env DIR] [--ckpt FILE] [--striped N] [--share 1] [--stages FILE]
// 1. "imports": every file named in LIST, in order, the way an interpreter
//    reads a module: stat, open, fstat, one read of the whole file, then some
//    work on the bytes (a CRC stands for unmarshalling);
// 2. the installed environment's files (DIR), likewise, in path order;
// 3. the checkpoint: one sequential buffered read into memory (what
//    torch.load / safetensors.load_file without mmap do), or a striped load
//    through the start-up plugin's loader (--striped N), possibly mapping the
//    node's shared copy (--share 1) that another process is reading or has
//    read; the job then checksums the bytes it got, as a consumer touches them.
#include "command_line.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "stages.hpp"
#include "striped_read.hpp"
#include "util.hpp"

using namespace ballast::startup;

namespace {

uint32_t import_file(const std::string& path, std::vector<char>& buf, uint64_t& bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ::fstat(fd, &st);
  if (buf.size() < size_t(st.st_size) + 1) buf.resize(size_t(st.st_size) + 1);
  ssize_t n = ::read(fd, buf.data(), buf.size());
  ::close(fd);
  if (n <= 0) return 0;
  bytes += uint64_t(n);
  return crc32c(buf.data(), size_t(n));
}

}  // namespace

int main(int argc, char** argv) {
  std::string imports, env, ckpt, stages;
  unsigned striped = 0;
  bool share = false;
  std::string share_flag;
  CLI::App app(
      "The job whose cold start bench_startup measures: imports files, reads its environment, loads a "
      "checkpoint.",
      "bench_startup_job");
  app.add_option("--imports", imports, "file listing the files it imports, in order");
  app.add_option("--env", env, "installed environment it reads");
  app.add_option("--ckpt", ckpt, "checkpoint it loads");
  app.add_option("--striped", striped, "readers of a striped load (0: one plain read)");
  app.add_option("--stages", stages, "stage log to append to");
  app.add_option("--share", share_flag, "1: share the load among this node's processes")
      ->check(CLI::IsMember({"0", "1"}));
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  share = share_flag == "1";
  StageLog log(nullptr, stages);
  std::vector<char> buf;
  uint32_t acc = 0;
  uint64_t bytes = 0;
  int64_t t = wall_ns();
  if (!imports.empty()) {
    std::ifstream in(imports);
    std::string path;
    while (std::getline(in, path)) acc ^= import_file(path, buf, bytes);
  }
  if (!env.empty()) {
    std::vector<std::string> files;
    for (auto& e : std::filesystem::recursive_directory_iterator(env))
      if (e.is_regular_file()) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) acc ^= import_file(f, buf, bytes);
  }
  log.record({"imports", "", -1, t, wall_ns(), bytes, 0, ""});
  if (!ckpt.empty()) {
    t = wall_ns();
    uint64_t size = 0;
    if (striped > 0) {
      LoadOptions o;
      o.stripes = striped;
      o.share = share;
      LoadedFile f = load_file(ckpt, o);
      acc ^= share ? crc32c(f.data, f.size) : f.checksum;
      size = f.size;
    } else {
      int fd = ::open(ckpt.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st {};
      ::fstat(fd, &st);
      size = uint64_t(st.st_size);
      std::unique_ptr<char[]> mem(new char[size]);  // uninitialised, as a tensor allocation
      const size_t step = 8 << 20;
      uint64_t off = 0;
      uint32_t crc = 0;
      while (off < size) {
        ssize_t n = ::read(fd, mem.get() + off, std::min<uint64_t>(step, size - off));
        if (n <= 0) break;
        crc = crc32c_update(crc, mem.get() + off, size_t(n));
        off += uint64_t(n);
      }
      ::close(fd);
      acc ^= crc;
    }
    log.record({"checkpoint_load", "", -1, t, wall_ns(), size, 0, striped ? "striped" : "sequential"});
  }
  // The exit code depends on the checksums, so none of the work can be skipped;
  // 0 unless every one of 32 bits happens to be set.
  return acc == 0xFFFFFFFFu ? 3 : 0;
}
