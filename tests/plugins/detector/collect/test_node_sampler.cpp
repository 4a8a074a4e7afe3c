// The collector reading this machine's real /proc, /sys and cgroups.
#include <doctest/doctest.h>

#include "node_sampler.hpp"
#include "nvml.hpp"
#include "samples.hpp"

#include <ballast/events.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace ballast::collect;

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::map<std::string, Sample> by_name(const std::vector<Sample>& v) {
  std::map<std::string, Sample> m;
  for (const Sample& s : v) m.emplace(s.metric, s);
  return m;
}

// Burns CPU for about `ms` milliseconds of its own thread time.
void burn(int ms) {
  auto cpu_ns = [] {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
  };
  volatile double x = 1;
  long long end = cpu_ns() + ms * 1000000LL;
  while (cpu_ns() < end) x = x * 1.0000001 + 1e-9;
}

}  // namespace

TEST_CASE("rates: first reading gives nothing, a counter going backwards is flagged, not data") {
  Rates r;
  std::vector<Sample> out;
  r.add(&out, "c", 100, 1000000000);
  CHECK(out.empty());
  r.add(&out, "c", 300, 2000000000);
  REQUIRE(out.size() == 1);
  CHECK(out[0].value == 200);
  CHECK(out[0].flags == BALLAST_SAMPLE_COUNTER);
  r.add(&out, "c", 50, 3000000000);
  REQUIRE(out.size() == 2);
  CHECK(out[1].flags == (BALLAST_SAMPLE_COUNTER | BALLAST_SAMPLE_COUNTER_RESET));
  r.add(&out, "c", 150, 3500000000);  // restarts from the new reading
  REQUIRE(out.size() == 3);
  CHECK(out[2].value == 200);
  r.sweep();
  r.sweep();  // not read since the previous sweep: forgotten
  CHECK(r.size() == 0);
  add_gauge(&out, "g", std::numeric_limits<double>::quiet_NaN());
  add_gauge(&out, "h", std::numeric_limits<double>::infinity());
  CHECK(out[3].flags == BALLAST_SAMPLE_INVALID);
  CHECK(out[4].flags == BALLAST_SAMPLE_INVALID);
}

TEST_CASE("node metrics from the real /proc") {
  NodeSampler s(NodeOptions{});
  std::vector<Sample> first, second;
  CHECK(s.sample(now_ns(), &first) == 0);
  auto f = by_name(first);
  CHECK(f.count("mem.total_bytes"));
  CHECK(f.count("load.1"));
  CHECK_FALSE(f.count("cpu.user"));  // a rate needs two readings
  burn(150);
  CHECK(s.sample(now_ns(), &second) == 0);
  auto m = by_name(second);
  for (const char* k : {"cpu.user", "cpu.system", "cpu.iowait", "cpu.steal", "cpu.idle", "ctxt", "mem.used_bytes",
                        "mem.available_bytes", "net.lo.rx_bytes", "net.lo.tx_drops", "net.tcp.retrans"}) {
    INFO(k);
    CHECK(m.count(k));
  }
  double sum =
      m["cpu.user"].value + m["cpu.system"].value + m["cpu.iowait"].value + m["cpu.steal"].value + m["cpu.idle"].value;
  CHECK(sum <= 100.5);
  CHECK(m["cpu.user"].value + m["cpu.system"].value > 0);  // we burnt 150 ms
  CHECK(m["mem.total_bytes"].value >= m["mem.used_bytes"].value);
  bool disk = false;
  for (const auto& [k, v] : m) disk = disk || (k.rfind("disk.", 0) == 0 && k.find(".write_bytes") != std::string::npos);
  CHECK(disk);
  for (const Sample& x : second) {
    INFO(x.metric);
    CHECK(std::isfinite(x.value));
    CHECK((x.flags & BALLAST_SAMPLE_INVALID) == 0);
  }
}

TEST_CASE("the job's processes: CPU, RSS, context switches and disk writes of given pids") {
  // A child that burns CPU and writes (fsync'd) to a file.
  std::string file = "collect_io_" + std::to_string(getpid());
  pid_t child = fork();
  if (child == 0) {
    int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<char> block(1 << 20, 'x');
    for (;;) {
      burn(20);
      if (write(fd, block.data(), block.size()) < 0) _exit(1);
      fsync(fd);
      lseek(fd, 0, SEEK_SET);
      usleep(5000);
    }
  }
  NodeOptions o;
  o.system = false;
  o.pids = {child};
  NodeSampler s(o);
  std::vector<Sample> first, second;
  s.sample(now_ns(), &first);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  s.sample(now_ns(), &second);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  unlink(file.c_str());
  auto m = by_name(second);
  CHECK(m["proc.count"].value == 1);
  CHECK(m["proc.rss_bytes"].value > 1 << 20);
  CHECK(m["proc.cpu"].value > 0);
  CHECK(m["proc.ctxt_voluntary"].value > 0);  // fsync and usleep block
  CHECK(m["proc.write_bytes"].value > 0);
  CHECK_FALSE(m.count("cpu.user"));  // system metrics are off
  // The process is gone: nothing is reported for it, nothing fails.
  std::vector<Sample> third;
  CHECK(s.sample(now_ns(), &third) == 0);
  CHECK(by_name(third)["proc.count"].value == 0);
}

TEST_CASE("processes matched by name") {
  pid_t child = fork();
  if (child == 0) {
    execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
    _exit(127);
  }
  // Until the child has exec'd (its name was this test's until then).
  std::string comm;
  for (int i = 0; i < 2000 && comm != "sleep"; ++i) {
    usleep(5000);
    std::ifstream f("/proc/" + std::to_string(child) + "/comm");
    std::getline(f, comm);
  }
  CHECK(comm == "sleep");
  NodeOptions o;
  o.system = false;
  o.process_name = "sleep";
  NodeSampler s(o);
  std::vector<Sample> out;
  s.sample(now_ns(), &out);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  CHECK(by_name(out)["proc.count"].value >= 1);
}

TEST_CASE("cgroup v2 stats of a job in its own cgroup") {
  const std::string root = "/sys/fs/cgroup/unified";
  std::string dir = root + "/ballast-test-collect-" + std::to_string(getpid());
  if (access((root + "/cgroup.procs").c_str(), W_OK) != 0 || mkdir(dir.c_str(), 0755) != 0) {
    MESSAGE("cgroup v2 is not writable here: case skipped");
    return;
  }
  pid_t child = fork();
  if (child == 0) {
    std::ofstream(dir + "/cgroup.procs") << getpid() << std::flush;
    for (;;) {
      burn(30);
      usleep(10000);
    }
  }
  usleep(50000);
  NodeOptions o;
  o.system = false;
  o.cgroups = {dir};
  NodeSampler s(o);
  std::vector<Sample> first, second;
  s.sample(now_ns(), &first);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  s.sample(now_ns(), &second);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  rmdir(dir.c_str());
  auto m = by_name(second);
  CHECK(m["proc.count"].value == 1);  // cgroup.procs gives the job's processes
  CHECK(m.count("cgroup.cpu.usage"));
  CHECK(m["cgroup.cpu.usage"].value > 0);
  CHECK(m.count("cgroup.cpu.pressure"));
}

TEST_CASE("without NVML: a clear reason and no GPU") {
  Nvml nvml;
  std::string why;
  if (nvml.open(&why)) {
    // A machine with a GPU: its metrics must come out.
    Rates r;
    std::vector<Sample> out;
    nvml.sample(now_ns(), &r, &out);
    CHECK(nvml.gpu_count() > 0);
    CHECK(by_name(out).count("gpu0.util"));
    CHECK(by_name(out).count("gpu0.mem_used_bytes"));
  } else {
    CHECK(why.find("libnvidia-ml.so.1") != std::string::npos);
    CHECK(nvml.gpu_count() == 0);
  }
  Nvml wrong;
  CHECK_FALSE(wrong.open(&why, "libz.so.1"));
  CHECK(why == "libz.so.1: no symbol nvmlInit_v2 (not NVML?)");
}
