#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.hpp"
#include "hotblocks.hpp"
#include "startup_command.hpp"
#include "striped_read.hpp"

using namespace ballast::startup;
using startup_test::TempDir;

namespace {

int run(std::vector<std::string> args) {
  args.insert(args.begin(), "ballast startup");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return run_command(nullptr, int(args.size()), argv.data());
}

// Written, synced and dropped from the page cache.
void make_cold(const std::string& path, size_t bytes, uint64_t seed) {
  startup_test::write_text(path, startup_test::pattern(bytes, seed));
  int fd = ::open(path.c_str(), O_RDONLY);
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace

TEST_CASE("record captures the blocks real processes read, in first-need order") {
  TempDir d;
  make_cold(d / "a.bin", 1 << 20, 1);
  make_cold(d / "b.bin", 2 << 20, 2);
  make_cold(d / "c.bin", 512 << 10, 3);
  make_cold(d / "unread.bin", 1 << 20, 4);
  std::string script = "cat " + (d / "b.bin") + " > /dev/null; dd if=" + (d / "a.bin") +
                       " bs=4096 skip=64 count=1 status=none > /dev/null; python3 -c \"import os; fd=os.open('" +
                       (d / "c.bin") + "', os.O_RDONLY); os.pread(fd, 100, 300000)\"";
  std::string profile = d / "p.json";
  REQUIRE(run({"record", "--profile", profile, "--block-kib", "256", "--", "sh", "-c", script}) == 0);
  HotProfile all = read_profile(profile);
  // sh, dd and python3 read their own libraries and modules too: keep ours.
  HotProfile p = all;
  p.extents.clear();
  for (const auto& e : all.extents)
    if (all.files[e.file].path.rfind(d.path + "/", 0) == 0) p.extents.push_back(e);
  CHECK(all.extents.size() > p.extents.size());
  REQUIRE(p.extents.size() == 3);
  auto path_of = [&](const Extent& e) { return p.files[e.file].path; };
  CHECK(path_of(p.extents[0]) == d / "b.bin");
  CHECK(p.extents[0].offset == 0);
  CHECK(p.extents[0].length == (2u << 20));  // eight 256 KiB blocks merged
  CHECK(path_of(p.extents[1]) == d / "a.bin");
  CHECK(p.extents[1].offset == 256 * 1024);
  CHECK(p.extents[1].length == 256 * 1024);
  CHECK(path_of(p.extents[2]) == d / "c.bin");
  CHECK(p.extents[2].offset == 256 * 1024);  // byte 300000 lies in the second block
  CHECK(p.extents[2].length == 256 * 1024);  // the file's last, short block
  for (const auto& f : p.files) CHECK(f.path != d / "unread.bin");
}

TEST_CASE("record --exclude leaves out files under a prefix") {
  TempDir d;
  make_cold(d / "keep/a.bin", 256 << 10, 13);
  make_cold(d / "ckpt/b.bin", 256 << 10, 14);
  std::string script = "cat " + (d / "keep/a.bin") + " " + (d / "ckpt/b.bin") + " > /dev/null";
  REQUIRE(run({"record", "--profile", d / "p.json", "--exclude", d / "ckpt", "--", "sh", "-c", script}) == 0);
  HotProfile p = read_profile(d / "p.json");
  bool saw_a = false;
  for (const auto& f : p.files) {
    CHECK(f.path.rfind(d / "ckpt", 0) != 0);
    saw_a |= f.path == d / "keep/a.bin";
  }
  CHECK(saw_a);
}

TEST_CASE("record keeps the exit code of the command and writes a profile even when nothing was read") {
  TempDir d;
  CHECK(run({"record", "--profile", d / "p.json", "--", "sh", "-c", "exit 3"}) == 3);
  CHECK(read_profile(d / "p.json").extents.empty());
  CHECK(run({"record", "--profile", d / "p.json"}) == 2);  // no command
}

TEST_CASE("prefetch brings the profiled blocks into the page cache, and only those, within the budget") {
  TempDir d;
  make_cold(d / "a.bin", 4 << 20, 5);
  make_cold(d / "b.bin", 4 << 20, 6);
  HotProfile p;
  p.block_bytes = 1 << 20;
  FileId ia, ib;
  REQUIRE(file_id(d / "a.bin", ia));
  REQUIRE(file_id(d / "b.bin", ib));
  p.files = {{d / "a.bin", ia}, {d / "b.bin", ib}};
  p.extents = {{1, 0, 4 << 20}, {0, 1 << 20, 1 << 20}};
  write_profile(d / "p.json", p);
  HotProfile back = read_profile(d / "p.json");
  REQUIRE(back.extents.size() == 2);

  SUBCASE("whole profile") {
    CHECK(resident_fraction(d / "b.bin") < 0.5);
    Prefetcher pf(back, PrefetchOptions{4, 0, 1 << 20});
    pf.start();
    // idle() turns true by itself once every block was read, without wait().
    for (int i = 0; i < 6000 && !pf.idle(); ++i) ::usleep(10000);
    CHECK(pf.idle());
    CHECK(resident_fraction(d / "b.bin") == doctest::Approx(1.0));
    pf.wait();
    CHECK(pf.stats().done_bytes == (5u << 20));
    CHECK(pf.stats().files_ok == 2);
    CHECK(resident_fraction(d / "b.bin") == doctest::Approx(1.0));
    CHECK(resident_fraction(d / "a.bin") < 0.5);  // one MiB of four
  }
  SUBCASE("budget cuts the tail of the first-need order") {
    Prefetcher pf(back, PrefetchOptions{2, 3 << 20, 1 << 20});
    pf.start();
    pf.wait();
    CHECK(pf.stats().planned_bytes == (3u << 20));
    CHECK(pf.stats().budget_cut_bytes == (2u << 20));
    CHECK(pf.stats().done_bytes == (3u << 20));
  }
}

TEST_CASE("a stale profile skips changed and vanished files with a message and still warms the rest") {
  TempDir d;
  make_cold(d / "keep.bin", 1 << 20, 7);
  make_cold(d / "grow.bin", 1 << 20, 8);
  make_cold(d / "gone.bin", 1 << 20, 9);
  make_cold(d / "touch.bin", 1 << 20, 10);
  HotProfile p;
  for (const char* n : {"keep.bin", "grow.bin", "gone.bin", "touch.bin"}) {
    FileId id;
    REQUIRE(file_id(d / n, id));
    p.files.push_back({d / n, id});
    p.extents.push_back({uint32_t(p.files.size() - 1), 0, 1 << 20});
  }
  write_profile(d / "p.json", p);
  startup_test::write_text(d / "grow.bin", startup_test::pattern(2 << 20, 11));
  std::filesystem::remove(d / "gone.bin");
  struct timespec ts[2] = {{0, UTIME_OMIT}, {12345, 0}};
  REQUIRE(::utimensat(AT_FDCWD, (d / "touch.bin").c_str(), ts, 0) == 0);
  drop(d / "keep.bin");

  Prefetcher pf(read_profile(d / "p.json"), PrefetchOptions{});
  pf.start();
  pf.wait();
  const auto& s = pf.stats();
  CHECK(s.files_ok == 1);
  CHECK(s.files_skipped == 3);
  CHECK(s.done_bytes == (1u << 20));
  std::string all;
  for (const auto& m : s.messages) all += m + "\n";
  CHECK(all.find("grow.bin: size 1048576 -> 2097152") != std::string::npos);
  CHECK(all.find("gone.bin: No such file or directory (vanished") != std::string::npos);
  CHECK(all.find("touch.bin: modified since the profile") != std::string::npos);
  CHECK(resident_fraction(d / "keep.bin") == doctest::Approx(1.0));
}

TEST_CASE("a malformed profile is refused by name, and prefetch then just runs the job") {
  TempDir d;
  startup_test::write_text(d / "bad.json", R"({"format":"ballast-startup-hotblocks","version":1,"block_bytes":4096,
    "files":[{"path":"/x","size":10,"mtime_ns":0,"dev":1,"ino":2}],"extents":[[3,0,10]]})");
  CHECK_THROWS_WITH_AS(read_profile(d / "bad.json"), doctest::Contains("extents[0]: file index 3 is out of range"),
                       Error);
  startup_test::write_text(d / "trunc.json", R"({"format":"ballast-startup-hotblocks","vers)");
  CHECK_THROWS_WITH_AS(read_profile(d / "trunc.json"), doctest::Contains("not a JSON profile"), Error);
  CHECK(run({"prefetch", d / "trunc.json", "--", "sh", "-c", "touch " + (d / "ran") + "; exit 4"}) == 4);
  CHECK(std::filesystem::exists(d / "ran"));
  CHECK(run({"prefetch", d / "missing.json"}) == 1);
}

TEST_CASE("prefetch -- CMD runs the job beside the prefetcher and records a file_warmup stage") {
  TempDir d;
  make_cold(d / "a.bin", 3 << 20, 12);
  std::string profile = d / "p.json";
  REQUIRE(run({"record", "--profile", profile, "--", "sh", "-c", "cat " + (d / "a.bin") + " > /dev/null"}) == 0);
  drop(d / "a.bin");
  std::string stages = d / "stages.jsonl";
  CHECK(run({"prefetch", profile, "--stages", stages, "--", "sh", "-c", "cat " + (d / "a.bin") + " > /dev/null"}) == 0);
  std::string log = startup_test::read_text(stages);
  CHECK(log.find("\"stage\":\"file_warmup\"") != std::string::npos);
}

TEST_CASE("the relevance check stops on another job's profile and keeps a profile the job uses") {
  HotProfile p;
  p.files = {{"/a", FileId{1, 10, 0, 0}}, {"/b", FileId{1, 11, 0, 0}}};
  RelevanceCheck wrong(p.files, 3);
  CHECK(wrong.observe({{1, 20}, {1, 21}}) == RelevanceCheck::kUndecided);
  CHECK(wrong.observe({{1, 20}}) == RelevanceCheck::kUndecided);     // the same file again
  CHECK(wrong.observe({{2, 10}}) == RelevanceCheck::kWrongProfile);  // same inode, other device
  RelevanceCheck right(p.files, 3);
  CHECK(right.observe({{1, 20}, {1, 21}}) == RelevanceCheck::kUndecided);
  CHECK(right.observe({{1, 11}}) == RelevanceCheck::kRelevant);
  CHECK(right.observe({{1, 30}, {1, 31}, {1, 32}}) == RelevanceCheck::kRelevant);  // settled
}

TEST_CASE("open_files_of lists the regular files a process tree holds open") {
  TempDir d;
  startup_test::write_text(d / "one", "1");
  startup_test::write_text(d / "two", "2");
  FileId one, two;
  REQUIRE(file_id(d / "one", one));
  REQUIRE(file_id(d / "two", two));
  // The shell holds "one"; its child (a subshell) holds "two"; both wait.
  std::string script =
      "exec 3<" + (d / "one") + "; (exec 4<" + (d / "two") + "; touch " + (d / "ready") + "; sleep 30) & wait";
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setpgid(0, 0);  // its own process group, ended as a whole below
    ::execlp("sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 500 && !std::filesystem::exists(d / "ready"); ++i) ::usleep(10000);
  bool saw_one = false, saw_two = false;
  for (int i = 0; i < 100 && !(saw_one && saw_two); ++i) {  // the subshell may still be settling
    for (const auto& id : open_files_of(pid)) {
      saw_one |= id == std::make_pair(one.dev, one.ino);
      saw_two |= id == std::make_pair(two.dev, two.ino);
    }
    if (!(saw_one && saw_two)) ::usleep(10000);
  }
  CHECK(saw_one);
  CHECK(saw_two);
  ::kill(-pid, SIGKILL);  // the shell, its subshell and sleep
  ::waitpid(pid, nullptr, 0);
}

TEST_CASE("a prefetch watching a real job stops early when the job reads none of the profile's files") {
  TempDir d;
  // The profile: one huge sparse file, far more than can be read before the
  // job shows what it opens (8 GiB in 4 KiB reads by one thread).
  const uint64_t big = 8ull << 30;
  {
    int fd = ::open((d / "big.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, off_t(big)) == 0);
    ::close(fd);
  }
  HotProfile p;
  FileId id;
  REQUIRE(file_id(d / "big.bin", id));
  p.files = {{d / "big.bin", id}};
  p.extents = {{0, 0, big}};
  // The job: holds 20 other files open (tail -f keeps every one open).
  std::vector<std::string> argv = {"tail", "-q", "-f"};
  for (int i = 0; i < 20; ++i) {
    startup_test::write_text(d / ("other" + std::to_string(i)), "x\n");
    argv.push_back(d / ("other" + std::to_string(i)));
  }
  Prefetcher pf(p, PrefetchOptions{1, big, 4096});
  pf.start();
  // Until it execs, the job is a copy of this process and holds the profile's
  // file (as the workers hold it): the watcher must not take that for the job
  // reading the profile. The child waits before exec to make this certain.
  int held = ::open((d / "big.bin").c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(held >= 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setpgid(0, 0);
    struct timespec before_exec = {0, 300 * 1000 * 1000};
    ::nanosleep(&before_exec, nullptr);
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execvp("tail", args.data());
    ::_exit(127);
  }
  ::close(held);
  pf.watch(pid, 16);
  pf.wait();  // returns once the watcher has stopped the workers
  ::kill(-pid, SIGKILL);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  drop(d / "big.bin");
  const PrefetchStats& s = pf.stats();
  CHECK(s.stopped_early);
  CHECK(s.done_bytes < s.planned_bytes);
  bool said = false;
  for (const auto& m : s.messages) said |= m.find("none is in the profile") != std::string::npos;
  CHECK(said);
}
