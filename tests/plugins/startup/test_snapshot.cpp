#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.hpp"
#include "snapshot.hpp"

using namespace ballast::startup;
using startup_test::read_text;
using startup_test::TempDir;
using startup_test::write_text;
namespace fs = std::filesystem;

namespace {

void make_env(const std::string& dir) {
  write_text(dir + "/lib/pkg_a/__init__.py", "import os\n" + std::string(5000, 'a'));
  write_text(dir + "/lib/pkg_a/data.bin", startup_test::pattern(300000, 1));
  write_text(dir + "/lib/pkg_b/mod.py", "x = 1\n");
  write_text(dir + "/bin/tool", "#!/bin/sh\necho hi\n");
  fs::permissions(dir + "/bin/tool", fs::perms(0755));
  fs::create_directories(dir + "/share/empty");
  fs::create_symlink("../lib/pkg_b/mod.py", dir + "/bin/link");
}

// The tree as text: relative paths, types, modes, contents.
std::string listing(const std::string& dir) {
  std::vector<std::string> lines;
  for (auto& e : fs::recursive_directory_iterator(dir)) {
    std::string rel = fs::relative(e.path(), dir).string();
    auto st = e.symlink_status();
    std::string line = rel + " " + std::to_string(int(st.type())) + " " + std::to_string(int(st.permissions()));
    if (fs::is_symlink(st))
      line += " -> " + fs::read_symlink(e.path()).string();
    else if (fs::is_regular_file(st))
      line += " " + std::to_string(std::hash<std::string>{}(read_text(e.path().string())));
    lines.push_back(line);
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (auto& l : lines) out += l + "\n";
  return out;
}

void flip_byte(const std::string& path, uint64_t at) {
  std::string s = read_text(path);
  s[at] = char(s[at] ^ 0x5A);
  write_text(path, s);
}

}  // namespace

TEST_CASE("a snapshot restores the same tree: files, modes, symlinks, empty directories") {
  TempDir d;
  make_env(d / "env");
  SnapshotInfo made = create_snapshot(d / "env", d / "s.bsnap");
  CHECK(made.files == 4);
  CHECK(made.symlinks == 1);
  CHECK(fs::file_size(d / "s.bsnap") == made.archive_bytes);
  SnapshotInfo got = restore_snapshot(d / "s.bsnap", d / "restored");
  CHECK(got.files == 4);
  CHECK(got.data_bytes == made.data_bytes);
  CHECK(listing(d / "env") == listing(d / "restored"));
  // Restoring over an existing directory replaces it as a whole.
  write_text(d / "restored/stale.txt", "old");
  restore_snapshot(d / "s.bsnap", d / "restored");
  CHECK(listing(d / "env") == listing(d / "restored"));
}

TEST_CASE("a corrupted or truncated snapshot is detected and the target is left untouched") {
  TempDir d;
  make_env(d / "env");
  create_snapshot(d / "env", d / "s.bsnap");
  write_text(d / "target/keep.txt", "previous environment");
  const std::string before = listing(d / "target");
  const uint64_t size = fs::file_size(d / "s.bsnap");

  SUBCASE("a flipped byte in the middle") {
    fs::copy_file(d / "s.bsnap", d / "bad.bsnap");
    flip_byte(d / "bad.bsnap", size / 2);
    CHECK_THROWS_AS(restore_snapshot(d / "bad.bsnap", d / "target"), Corrupt);
  }
  SUBCASE("a flipped byte in every region") {
    for (uint64_t at : {uint64_t(3), uint64_t(9), uint64_t(40), size - 40, size - 20, size - 3}) {
      fs::remove(d / "bad.bsnap");
      fs::copy_file(d / "s.bsnap", d / "bad.bsnap");
      flip_byte(d / "bad.bsnap", at);
      CHECK_THROWS_AS(restore_snapshot(d / "bad.bsnap", d / "target"), Corrupt);
    }
  }
  SUBCASE("truncated") {
    for (uint64_t keep : {uint64_t(0), uint64_t(20), size / 2, size - 1}) {
      fs::remove(d / "bad.bsnap");
      fs::copy_file(d / "s.bsnap", d / "bad.bsnap");
      fs::resize_file(d / "bad.bsnap", keep);
      CHECK_THROWS_WITH_AS(restore_snapshot(d / "bad.bsnap", d / "target"), doctest::Contains("bad.bsnap"), Corrupt);
    }
  }
  CHECK(listing(d / "target") == before);
  for (auto& e : fs::directory_iterator(d.path))  // no temporary tree left behind
    CHECK(e.path().filename().string().find("ballast-restore") == std::string::npos);
}

TEST_CASE("env installs and snapshots on a miss, restores on a hit, rebuilds over a corrupted snapshot") {
  TempDir d;
  write_text(d / "lock.txt", "pkg_a==1.0\npkg_b==2.0\n");
  std::string install =
      "mkdir -p \"$BALLAST_ENV_DIR/lib\" && echo v1 > \"$BALLAST_ENV_DIR/lib/a.py\" && echo x >> " + (d / "installs");
  EnvOptions o;
  o.lockfiles = {d / "lock.txt"};
  o.dir = d / "env";
  o.store = d / "store";
  o.install = {"sh", "-c", install};

  EnvResult first = run_env(o);
  CHECK(first.exit_code == 0);
  CHECK(first.action == "installed+snapshot");
  CHECK(fs::exists(o.store + "/" + first.key + ".bsnap"));
  fs::remove_all(o.dir);
  EnvResult second = run_env(o);
  CHECK(second.action == "restored");
  CHECK(second.key == first.key);
  CHECK(read_text(o.dir + "/lib/a.py") == "v1\n");
  CHECK(read_text(d / "installs") == "x\n");  // installed once

  flip_byte(o.store + "/" + first.key + ".bsnap", 30);
  fs::remove_all(o.dir);
  EnvResult third = run_env(o);
  CHECK(third.action == "installed+snapshot");
  REQUIRE(!third.messages.empty());
  CHECK(third.messages[0].find("ignoring snapshot") != std::string::npos);
  CHECK(read_text(o.dir + "/lib/a.py") == "v1\n");

  // Another lockfile content is another key.
  write_text(d / "lock.txt", "pkg_a==1.1\n");
  EnvResult fourth = run_env(o);
  CHECK(fourth.key != first.key);
  CHECK(fourth.action == "installed+snapshot");
}

TEST_CASE("a missing lockfile falls back to the plain install with a message naming it") {
  TempDir d;
  EnvOptions o;
  o.lockfiles = {d / "nope.lock"};
  o.dir = d / "env";
  o.store = d / "store";
  o.install = {"sh", "-c", "mkdir -p \"$BALLAST_ENV_DIR\" && touch \"$BALLAST_ENV_DIR/ok\""};
  EnvResult r = run_env(o);
  CHECK(r.exit_code == 0);
  CHECK(r.action == "installed");
  REQUIRE(r.messages.size() == 1);
  CHECK(r.messages[0] ==
        "lockfile " + (d / "nope.lock") + ": No such file or directory; running the install without a snapshot");
  CHECK(fs::exists(d / "env/ok"));
  CHECK(!fs::exists(d / "store"));
  // A failing install is reported as such, and nothing is snapshotted.
  write_text(d / "l.lock", "x");
  o.lockfiles = {d / "l.lock"};
  o.install = {"sh", "-c", "exit 5"};
  EnvResult f = run_env(o);
  CHECK(f.exit_code == 5);
  CHECK(f.action == "failed");
  CHECK(!fs::exists(o.store + "/" + f.key + ".bsnap"));
}

TEST_CASE("concurrent builders of one key install once; the others restore the published snapshot") {
  TempDir d;
  write_text(d / "lock.txt", "same\n");
  const int n = 4;
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      EnvOptions o;
      o.lockfiles = {d / "lock.txt"};
      o.dir = d / ("env" + std::to_string(i % 1));  // all nodes install into the same path
      o.store = d / "store";
      o.install = {"sh", "-c",
                   "echo run >> " + (d / "installs") +
                       "; sleep 0.3; mkdir -p \"$BALLAST_ENV_DIR\" && echo ok > \"$BALLAST_ENV_DIR/f\""};
      EnvResult r = run_env(o);
      ::_exit(r.exit_code == 0 && (r.action == "restored" || r.action == "installed+snapshot") ? 0 : 1);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
  }
  CHECK(read_text(d / "installs") == "run\n");
  CHECK(read_text(d / "env0/f") == "ok\n");
  size_t archives = 0;
  for (auto& e : fs::directory_iterator(d / "store")) {
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
    archives += e.path().extension() == ".bsnap";
  }
  CHECK(archives == 1);
}

TEST_CASE("a store that cannot take the snapshot leaves the installed environment and no partial archive") {
  TempDir d;
  write_text(d / "lock.txt", "big\n");
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // A file-size limit makes every write past 64 KiB fail like a full disk (EFBIG).
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {64 << 10, 64 << 10};
    ::setrlimit(RLIMIT_FSIZE, &rl);
    EnvOptions o;
    o.lockfiles = {d / "lock.txt"};
    o.dir = d / "env";
    o.store = d / "store";
    o.install = {"sh", "-c",
                 "mkdir -p \"$BALLAST_ENV_DIR\" && head -c 60000 /dev/urandom > \"$BALLAST_ENV_DIR/a\" && "
                 "head -c 60000 /dev/urandom > \"$BALLAST_ENV_DIR/b\""};
    EnvResult r = run_env(o);
    bool ok = r.exit_code == 0 && r.action == "installed" && !r.messages.empty() &&
              r.messages[0].find("snapshot not stored") != std::string::npos;
    ::_exit(ok ? 0 : 1);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(fs::file_size(d / "env/a") == 60000);
  CHECK(fs::file_size(d / "env/b") == 60000);
  for (auto& e : fs::directory_iterator(d / "store")) CHECK(e.path().extension() == ".lock");
}

TEST_CASE("eviction removes the least recently used snapshots down to the cap") {
  TempDir d;
  fs::create_directories(d / "store");
  for (int i = 0; i < 4; ++i) {
    write_text(d / ("store/k" + std::to_string(i) + ".bsnap"), std::string(1000, 'x'));
    struct timespec ts[2] = {{0, UTIME_OMIT}, {1000 + i, 0}};
    ::utimensat(AT_FDCWD, (d / ("store/k" + std::to_string(i) + ".bsnap")).c_str(), ts, 0);
  }
  auto removed = evict_snapshots(d / "store", 2500, d / "store/k0.bsnap");
  REQUIRE(removed.size() == 2);
  CHECK(fs::path(removed[0]).filename() == "k1.bsnap");  // k0 is kept though oldest
  CHECK(fs::path(removed[1]).filename() == "k2.bsnap");
  CHECK(fs::exists(d / "store/k0.bsnap"));
  CHECK(fs::exists(d / "store/k3.bsnap"));
}

TEST_CASE("the key depends on lockfile content, platform and directory") {
  TempDir d;
  write_text(d / "a.lock", "x");
  auto k = environment_key({d / "a.lock"}, "p1", "/env");
  CHECK(k.size() == 32);
  CHECK(k == environment_key({d / "a.lock"}, "p1", "/env"));
  CHECK(k != environment_key({d / "a.lock"}, "p2", "/env"));
  CHECK(k != environment_key({d / "a.lock"}, "p1", "/env2"));
  write_text(d / "a.lock", "y");
  CHECK(k != environment_key({d / "a.lock"}, "p1", "/env"));
  CHECK_THROWS_AS(environment_key({d / "none.lock"}, "p1", "/env"), Error);
}
