// /proc/PID/stat of plugins/common: the one parser of the hang detector, the
// executor, the UCX plugin and the collector.
#include <doctest/doctest.h>

#include "proc_stat.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

using ballast::util::parse_proc_stat;
using ballast::util::ProcStat;
using ballast::util::read_proc_stat;

namespace {
// A real line (proc(5) fields 1-52), its command holding spaces and parentheses.
const char* kLine =
    "4242 (tricky) name) (x) S 1 4242 4242 0 -1 4194560 1234 0 5 0 321 45 0 0 20 0 3 0 98765 123456789 2048 "
    "18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 17 3 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
}  // namespace

TEST_CASE("parse_proc_stat: the fields after the last ')' by their proc(5) numbers") {
  ProcStat s;
  REQUIRE(parse_proc_stat(kLine, &s));
  CHECK(s.state == 'S');
  CHECK(s.utime == 321);
  CHECK(s.stime == 45);
  CHECK(s.start_time == 98765);
  CHECK(s.rss_pages == 2048);
}

TEST_CASE("parse_proc_stat: what is not a stat line is refused, the output left alone") {
  ProcStat s;
  s.state = 'q';
  CHECK_FALSE(parse_proc_stat("", &s));
  CHECK_FALSE(parse_proc_stat("4242 no parenthesis S 1 2 3", &s));
  CHECK_FALSE(parse_proc_stat("4242 (short) S 1 2 3 4 5 6 7 8 9 10", &s));  // ends before rss
  CHECK_FALSE(parse_proc_stat("4242 (x) SS 1 4242 4242 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5 6 7", &s));
  CHECK_FALSE(parse_proc_stat("4242 (x) S 1 4242 4242 0 -1 0 0 0 0 0 1x 2 0 0 20 0 1 0 5 6 7", &s));
  CHECK(s.state == 'q');
}

TEST_CASE("read_proc_stat: this process runs; a stopped child is T; a reaped one is gone") {
  ProcStat self;
  REQUIRE(read_proc_stat(getpid(), &self));
  CHECK(self.state == 'R');
  CHECK(self.start_time > 0);
  CHECK(self.rss_pages > 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  REQUIRE(kill(child, SIGSTOP) == 0);
  ProcStat c;
  for (int i = 0; i < 500 && !(read_proc_stat(child, &c) && c.state == 'T'); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(c.state == 'T');
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  CHECK_FALSE(read_proc_stat(child, &c));
}

TEST_CASE("read_proc_stat: another proc root, as the collector's tests use") {
  const auto root = std::filesystem::temp_directory_path() / ("proc-" + std::to_string(getpid()));
  std::filesystem::create_directories(root / "4242");
  std::ofstream(root / "4242" / "stat") << kLine;
  ProcStat s;
  CHECK(read_proc_stat(4242, &s, root.string()));
  CHECK(s.utime == 321);
  CHECK_FALSE(read_proc_stat(4243, &s, root.string()));
  std::filesystem::remove_all(root);
}
