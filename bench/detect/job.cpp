#include "job.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace bench_detect {

namespace {

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text << std::flush;
  return static_cast<bool>(out);
}

int sh(const std::string& cmd) {
  int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

bool writable_cgroup_root(const std::string& root) {
  std::string probe = root + "/ballast-bench-probe-" + std::to_string(getpid());
  if (mkdir(probe.c_str(), 0755) != 0) return false;
  rmdir(probe.c_str());
  return true;
}

double thread_cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

// The worker's unit of work: a pseudo-random walk over a 64 KiB table, so
// that the work is fixed and only its speed depends on the machine.
double work(uint64_t iterations, uint64_t seed) {
  static double table[8192];
  uint64_t x = seed | 1;
  double acc = 0;
  for (uint64_t i = 0; i < iterations; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    double& t = table[x & 8191];
    t = t * 0.999 + static_cast<double>(x >> 40);
    acc += t;
  }
  return acc;
}

void join_cgroups(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--cgroup") == 0)
      write_file(std::string(argv[i + 1]) + "/cgroup.procs", std::to_string(getpid()));
}

const char* arg(int argc, char** argv, const char* name, const char* fallback = nullptr) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

}  // namespace

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::none:
      return "none";
    case Fault::cpu_hog:
      return "cpu_hog";
    case Fault::cpu_throttle:
      return "cpu_throttle";
    case Fault::sigstop:
      return "sigstop";
    case Fault::memory:
      return "memory";
    case Fault::disk_io:
      return "disk_io";
    case Fault::net_throttle:
      return "net_throttle";
  }
  return "?";
}

Capabilities probe() {
  Capabilities c;
  for (const char* root : {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}) {
    if (access((std::string(root) + "/cgroup.procs").c_str(), F_OK) == 0 &&
        access((std::string(root) + "/cpu.stat").c_str(), F_OK) == 0 && writable_cgroup_root(root)) {
      c.cgroup_v2 = true;
      c.v2_root = root;
      break;
    }
  }
  if (access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", W_OK) == 0 && writable_cgroup_root("/sys/fs/cgroup/cpu")) {
    c.cgroup_v1_cpu = true;
    c.v1_cpu_root = "/sys/fs/cgroup/cpu";
  }
  std::string ns = "bdet-probe-" + std::to_string(getpid());
  std::string vh = "bp" + std::to_string(getpid() % 100000) + "h", vn = "bp" + std::to_string(getpid() % 100000) + "n";
  if (sh("ip netns add " + ns) == 0) {
    if (sh("ip link add " + vh + " type veth peer name " + vn) == 0 && sh("ip link set " + vn + " netns " + ns) == 0) {
      c.netns = true;
      c.tbf = sh("ip netns exec " + ns + " tc qdisc add dev " + vn + " root tbf rate 8mbit burst 16kb limit 32kb") == 0;
      sh("ip netns exec " + ns + " tc qdisc del dev " + vn + " root");
      c.netem = sh("ip netns exec " + ns + " tc qdisc add dev " + vn + " root netem delay 10ms") == 0;
    }
    sh("ip link del " + vh);
    sh("ip netns del " + ns);
  }
  if (!c.cgroup_v2) c.notes += "cgroup v2 not writable: no per-machine cgroup stats; ";
  if (!c.cgroup_v1_cpu)
    c.notes += "no writable cgroup v1 cpu controller: no CPU throttling (cpu.max is not delegated in v2 here either); ";
  if (!c.netns) c.notes += "no network namespaces/veth: machines share the network, no network faults; ";
  if (!c.netem)
    c.notes +=
        "tc netem is not in this kernel (\"Specified qdisc kind is unknown\", modules disabled): "
        "no network delay/loss injection; network faults use tc tbf rate limiting instead; ";
  return c;
}

std::vector<Fault> available_faults(const Capabilities& caps, std::string* missing) {
  std::vector<Fault> f = {Fault::cpu_hog, Fault::sigstop, Fault::memory, Fault::disk_io};
  if (caps.cgroup_v1_cpu)
    f.insert(f.begin() + 1, Fault::cpu_throttle);
  else
    *missing += "cpu_throttle (no writable cpu controller); ";
  if (caps.netns && caps.tbf)
    f.push_back(Fault::net_throttle);
  else
    *missing += "net_throttle (no netns/veth/tbf); ";
  if (!caps.netem) *missing += "net delay/loss (no sch_netem in this kernel); ";
  return f;
}

Job::Job(JobOptions options, Capabilities caps) : opt_(std::move(options)), caps_(std::move(caps)) {
  tag_ = "bdet" + std::to_string(getpid());
  disk_file_ = "/var/tmp/" + tag_ + "-disk";
}

Job::~Job() {
  stop();
  for (auto& m : machines_) {
    if (!m.netns.empty()) sh("ip netns del " + m.netns);
    for (auto it = m.cgroups.rbegin(); it != m.cgroups.rend(); ++it) rmdir(it->c_str());
  }
  if (caps_.cgroup_v2) rmdir((caps_.v2_root + "/" + tag_).c_str());
  if (caps_.cgroup_v1_cpu) rmdir((caps_.v1_cpu_root + "/" + tag_).c_str());
}

bool Job::setup(std::string* error) {
  if (caps_.cgroup_v2) mkdir((caps_.v2_root + "/" + tag_).c_str(), 0755);
  if (caps_.cgroup_v1_cpu) mkdir((caps_.v1_cpu_root + "/" + tag_).c_str(), 0755);
  for (int k = 0; k < opt_.machines; ++k) {
    Machine m;
    m.name = "m" + std::to_string(k);
    if (caps_.cgroup_v2) {
      std::string d = caps_.v2_root + "/" + tag_ + "/" + m.name;
      if (mkdir(d.c_str(), 0755) != 0) {
        *error = d + ": " + std::strerror(errno);
        return false;
      }
      m.cgroups.push_back(d);
    }
    if (caps_.cgroup_v1_cpu) {
      std::string d = caps_.v1_cpu_root + "/" + tag_ + "/" + m.name;
      if (mkdir(d.c_str(), 0755) != 0) {
        *error = d + ": " + std::strerror(errno);
        return false;
      }
      m.cgroups.push_back(d);
    }
    if (caps_.netns) {
      m.netns = tag_ + "-" + m.name;
      std::string id = std::to_string(getpid() % 100000) + "_" + std::to_string(k);
      m.veth_host = "bh" + id;
      m.veth_ns = "bn" + id;  // renamed eth0 inside: every machine has the same interface name
      m.host_ip = "10.201." + std::to_string(k) + ".1";
      std::string ns_ip = "10.201." + std::to_string(k) + ".2";
      const std::string in = "ip netns exec " + m.netns + " ";
      for (const std::string& cmd :
           {"ip netns add " + m.netns, "ip link add " + m.veth_host + " type veth peer name " + m.veth_ns,
            "ip link set " + m.veth_ns + " netns " + m.netns, "ip addr add " + m.host_ip + "/30 dev " + m.veth_host,
            "ip link set " + m.veth_host + " up", in + "ip addr add " + ns_ip + "/30 dev " + m.veth_ns,
            in + "ip link set " + m.veth_ns + " name eth0", in + "ip link set eth0 up", in + "ip link set lo up"}) {
        if (sh(cmd) != 0) {
          *error = "network namespace setup failed: " + cmd;
          return false;
        }
      }
    } else {
      m.host_ip = "127.0.0.1";
    }
    machines_.push_back(std::move(m));
  }
  setup_done_ = true;
  return true;
}

pid_t Job::spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(opt_.self_exe.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    execv(opt_.self_exe.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

bool Job::start(std::string* error) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(listen_fd_, 256) != 0) {
    *error = std::string("coordinator: cannot listen: ") + std::strerror(errno);
    return false;
  }
  socklen_t len = sizeof a;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  steps_ = 0;
  running_ = true;
  coord_ = std::thread(&Job::coordinator, this, listen_fd_);
  double per_ms = calibrate_work();
  auto iters = static_cast<uint64_t>(per_ms * opt_.work_ms);
  for (size_t k = 0; k < machines_.size(); ++k) {
    Machine& m = machines_[k];
    for (int w = 0; w < opt_.workers; ++w) {
      std::vector<std::string> args = {"--worker",
                                       "--connect",
                                       m.host_ip + ":" + std::to_string(port_),
                                       "--iters",
                                       std::to_string(iters),
                                       "--payload",
                                       std::to_string(opt_.payload_bytes),
                                       "--seed",
                                       std::to_string(k * 100 + w + 1)};
      if (!m.netns.empty()) args.insert(args.end(), {"--netns", m.netns});
      for (const auto& c : m.cgroups) args.insert(args.end(), {"--cgroup", c});
      m.workers.push_back(spawn(args));
    }
  }
  // Wait until the job makes progress: every worker connected and stepping.
  for (int i = 0; i < 200 && steps_ < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (steps_ < 3) {
    *error = "the emulated job did not start (workers did not connect)";
    return false;
  }
  return true;
}

void Job::stop() {
  if (running_) {
    running_ = false;
    if (coord_.joinable()) coord_.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
  for (auto& m : machines_) {
    for (pid_t p : m.workers) kill(p, SIGCONT);
    for (pid_t p : m.workers) kill(p, SIGKILL);
    for (pid_t p : m.hogs) kill(p, SIGKILL);
    for (pid_t p : m.workers) waitpid(p, nullptr, 0);
    for (pid_t p : m.hogs) waitpid(p, nullptr, 0);
    m.workers.clear();
    m.hogs.clear();
    for (const auto& c : m.cgroups)
      if (access((c + "/cpu.cfs_quota_us").c_str(), W_OK) == 0) write_file(c + "/cpu.cfs_quota_us", "-1");
    if (!m.netns.empty()) sh("ip netns exec " + m.netns + " tc qdisc del dev eth0 root");
  }
  unlink(disk_file_.c_str());
}

bool Job::inject(Fault f, int k, std::string* error) {
  Machine& m = machines_[static_cast<size_t>(k)];
  std::vector<std::string> cg;
  for (const auto& c : m.cgroups) cg.insert(cg.end(), {"--cgroup", c});
  auto hog = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "--hog");
    args.insert(args.end(), cg.begin(), cg.end());
    m.hogs.push_back(spawn(args));
    return true;
  };
  switch (f) {
    case Fault::none:
      return true;
    case Fault::cpu_hog:
      return hog({"cpu"});
    case Fault::memory:
      return hog({"mem"});
    case Fault::disk_io:
      return hog({"disk", "--file", disk_file_});
    case Fault::sigstop:
      for (pid_t p : m.workers) kill(p, SIGSTOP);
      return true;
    case Fault::cpu_throttle:
      for (const auto& c : m.cgroups)
        if (access((c + "/cpu.cfs_quota_us").c_str(), W_OK) == 0)
          return write_file(c + "/cpu.cfs_quota_us", "2000");  // 2% of one CPU
      *error = "no cpu controller";
      return false;
    case Fault::net_throttle:
      if (sh("ip netns exec " + m.netns + " tc qdisc add dev eth0 root tbf rate 2mbit burst 10kb limit 20kb") != 0) {
        *error = "tc tbf failed";
        return false;
      }
      return true;
  }
  return false;
}

void Job::coordinator(int lfd) {
  struct Conn {
    int fd;
    uint64_t received = 0;
  };
  std::vector<Conn> conns;
  const size_t expected = machines_.size() * static_cast<size_t>(opt_.workers);
  fcntl(lfd, F_SETFL, O_NONBLOCK);
  std::vector<char> scratch(1 << 16);
  uint64_t step = 0;
  auto last_release = std::chrono::steady_clock::now();
  const auto pace = std::chrono::microseconds(static_cast<int64_t>(opt_.pace_ms * 1000));
  while (running_) {
    std::vector<pollfd> fds;
    fds.push_back({lfd, POLLIN, 0});
    for (const Conn& c : conns) fds.push_back({c.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 5);
    if (fds[0].revents & POLLIN) {
      int fd;
      while ((fd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) conns.push_back({fd});
    }
    for (size_t i = 0; i < conns.size(); ++i) {
      if (!(fds[i + 1].revents & (POLLIN | POLLHUP))) continue;
      for (;;) {
        ssize_t n = recv(conns[i].fd, scratch.data(), scratch.size(), 0);
        if (n <= 0) break;
        conns[i].received += static_cast<uint64_t>(n);
      }
    }
    if (conns.size() < expected) continue;
    bool all = true;
    for (const Conn& c : conns) all = all && c.received >= (step + 1) * static_cast<uint64_t>(opt_.payload_bytes);
    auto now = std::chrono::steady_clock::now();
    if (!all || now - last_release < pace) continue;
    for (const Conn& c : conns) send(c.fd, &step, sizeof step, MSG_NOSIGNAL);
    ++step;
    steps_ = step;
    last_release = now;
  }
  for (const Conn& c : conns) close(c.fd);
}

double calibrate_work() {
  static double per_ms = 0;
  if (per_ms > 0) return per_ms;
  const uint64_t n = 3000000;
  double best = 0;
  for (int r = 0; r < 3; ++r) {  // the fastest of three: least disturbed by neighbours
    double t0 = thread_cpu_ms();
    volatile double sink = work(n, 7);
    (void)sink;
    double ms = thread_cpu_ms() - t0;
    if (ms > 0) best = std::max(best, static_cast<double>(n) / ms);
  }
  per_ms = best;
  return per_ms;
}

int worker_main(int argc, char** argv) {
  join_cgroups(argc, argv);
  if (const char* ns = arg(argc, argv, "--netns")) {
    int fd = open(("/run/netns/" + std::string(ns)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) return 3;
    close(fd);
  }
  std::string target = arg(argc, argv, "--connect", "127.0.0.1:0");
  uint64_t iters = std::strtoull(arg(argc, argv, "--iters", "100000"), nullptr, 10);
  size_t payload = std::strtoull(arg(argc, argv, "--payload", "65536"), nullptr, 10);
  uint64_t seed = std::strtoull(arg(argc, argv, "--seed", "1"), nullptr, 10);
  size_t colon = target.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::atoi(target.c_str() + colon + 1)));
  inet_pton(AF_INET, target.substr(0, colon).c_str(), &a.sin_addr);
  int fd = -1;
  for (int i = 0; i < 100 && fd < 0; ++i) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd);
      fd = -1;
      usleep(50000);
    }
  }
  if (fd < 0) return 4;
  std::vector<char> data(payload, 'g');
  double sink = 0;
  for (uint64_t step = 0;; ++step) {
    sink += work(iters, seed + step);
    data[0] = static_cast<char>(sink);
    for (size_t sent = 0; sent < payload;) {
      ssize_t n = send(fd, data.data() + sent, payload - sent, MSG_NOSIGNAL);
      if (n <= 0) return 0;
      sent += static_cast<size_t>(n);
    }
    // Wait for the release like a progress engine: poll every 10 ms.
    uint64_t released = 0;
    size_t got = 0;
    while (got < sizeof released) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 10) <= 0) continue;
      ssize_t n = recv(fd, reinterpret_cast<char*>(&released) + got, sizeof released - got, 0);
      if (n <= 0) return 0;
      got += static_cast<size_t>(n);
    }
  }
}

int hog_main(int argc, char** argv) {
  join_cgroups(argc, argv);
  std::string kind = argc > 2 ? argv[2] : "";
  if (kind == "cpu") {
    volatile double x = 1;
    for (;;) x = x * 1.0000001 + 1e-9;
  }
  if (kind == "mem") {
    // Take 1 GiB in 64 MiB steps, touching every page, then keep touching it
    // so that it stays resident.
    const size_t chunk = 64u << 20, chunks = 16;
    std::vector<char*> mem;
    for (size_t i = 0; i < chunks; ++i) {
      auto* p = static_cast<char*>(mmap(nullptr, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      if (p == MAP_FAILED) break;
      std::memset(p, static_cast<int>(i + 1), chunk);
      mem.push_back(p);
      usleep(20000);
    }
    for (size_t round = 0;; ++round) {
      char* p = mem[round % mem.size()];
      for (size_t off = 0; off < chunk; off += 4096) p[off]++;
      usleep(100000);
    }
  }
  if (kind == "disk") {
    const char* file = arg(argc, argv, "--file", "/var/tmp/ballast-bench-disk");
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return 3;
    std::vector<char> block(1 << 20, 'd');
    for (uint64_t n = 0;; ++n) {
      if (write(fd, block.data(), block.size()) < 0) return 4;
      if (n % 4 == 3) fdatasync(fd);
      if (n % 256 == 255) lseek(fd, 0, SEEK_SET);  // stay within 256 MiB
    }
  }
  return 2;
}

}  // namespace bench_detect
