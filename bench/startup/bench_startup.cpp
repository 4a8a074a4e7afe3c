// bench/startup: a cold job start on this machine, plain and with each
// start-up technique alone and together, plus the checkpoint read modes
// against the device's O_DIRECT ceiling measured in the same run.
//
//   bench_startup [--dir DIR] [--reps 3] [--ckpt-mib 2560] [--tree-mib 300] [--files 4000] [--keep] [--reads-only]
//                 [--no-reads] [--cases plain,...]   (a subset of the start cases; plain, or striped for the
//                                                     striped_prefetch_* cases, is always run: the base they are
//                                                     compared with)
//                 [--reuse]   (use the data set an earlier --keep run left in DIR; implies --keep)
//                 [--trace]   (per start, on stderr: memory counters and the job's CPU time around the job)
//                 [--settle S]  (pause after each drop, for freed memory to reach the host; default 15)
//                 [--reads V,...]  (checkpoint read variants beside the O_DIRECT ceiling, see bench_reads;
//                                   default buffered_sequential,striped_8,striped_8_direct)
//
// The job (bench_startup_job) imports a tree of several thousand files,
// needs an environment installed from a lockfile (tar.gz packages extracted
// one by one, as pip does with wheels), and loads a safetensors checkpoint.
// Cold runs: before every run, syncfs() and posix_fadvise(DONTNEED) on every
// file of the data set, and the environment directory is deleted; mincore()
// over all files then checks how much is still resident (printed).
#include "command_line.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "hotblocks.hpp"
#include "snapshot.hpp"
#include "stages.hpp"
#include "startup_command.hpp"
#include "striped_read.hpp"
#include "util.hpp"

namespace fs = std::filesystem;
using namespace ballast::startup;

namespace {

struct Config {
  std::string dir = "startup-bench";
  int reps = 3;
  uint64_t ckpt_mib = 2560, tree_mib = 300, files = 4000;
  bool keep = false;
  bool reads_only = false;  // only the checkpoint read modes
  bool no_reads = false;    // only the start cases
  bool reuse = false;       // keep the data set of an earlier --keep run in DIR
  bool trace = false;       // one line per start on stderr: memory counters around the job
  std::vector<std::string> cases = {"plain", "snapshot",       "prefetch",      "striped",
                                    "all",   "prefetch_wrong", "prefetch_stale"};
  // Chosen with --cases only.
  std::vector<std::string> extra_cases = {"striped_prefetch_wrong", "striped_prefetch_stale"};
};

void emit(const std::string& c, const std::string& metric, double value, const std::string& unit) {
  std::printf("%s\n",
              nlohmann::json({{"bench", "startup"}, {"case", c}, {"metric", metric}, {"value", value}, {"unit", unit}})
                  .dump()
                  .c_str());
  std::fflush(stdout);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

double now_s() { return double(monotonic_ns()) / 1e9; }

// The 1-minute load average, recorded beside the figures: the machine is shared.
double loadavg() {
  double l = -1;
  std::ifstream("/proc/loadavg") >> l;
  return l;
}

// Named counters of /proc/vmstat and /proc/meminfo (kB), for --trace.
std::map<std::string, double> counters() {
  std::map<std::string, double> m;
  std::ifstream vm("/proc/vmstat");
  std::string k;
  double v;
  while (vm >> k >> v) m[k] = v;
  std::ifstream mi("/proc/meminfo");
  for (std::string line; std::getline(mi, line);) {
    std::istringstream in(line);
    if (in >> k >> v) m[k] = v;
  }
  return m;
}

double cpu_s(const struct timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; }

// Fast deterministic filler.
struct Rng {
  uint64_t x;
  explicit Rng(uint64_t seed) : x(seed * 0x9E3779B97F4A7C15ull + 7) {}
  uint64_t next() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  }
  void fill(char* p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t v = next();
      std::memcpy(p + i, &v, 8);
    }
    for (; i < n; ++i) p[i] = char(next());
  }
};

void write_file(const std::string& path, const char* data, size_t n) {
  fs::create_directories(fs::path(path).parent_path());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, data, n) != ssize_t(n)) throw Error(path + ": cannot write");
  ::close(fd);
}

// A tree of `files` files, `mib` MiB in all, sizes skewed like a Python
// environment (most small, a few large). Returns the paths.
std::vector<std::string> make_tree(const std::string& root, uint64_t files, uint64_t mib, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::lognormal_distribution<double> size_dist(9.8, 1.2);  // median ~18 KiB
  std::vector<double> sizes(files);
  double total = 0;
  for (auto& s : sizes) total += (s = std::min(size_dist(gen), 4e6));
  const double scale = double(mib << 20) / total;
  std::vector<std::string> paths;
  std::vector<char> buf;
  Rng rng(seed);
  for (uint64_t i = 0; i < files; ++i) {
    auto n = size_t(std::max(64.0, sizes[i] * scale));
    buf.resize(n);
    rng.fill(buf.data(), n);
    std::string p = root + "/pkg" + std::to_string(i / 50) + "/mod" + std::to_string(i % 50) + ".py";
    write_file(p, buf.data(), n);
    paths.push_back(p);
  }
  return paths;
}

// Text-like bytes (compress about 3x, as source code does).
void fill_text(Rng& rng, std::string& out, size_t n) {
  static const char* words[] = {
      "def ",   "return ",    "self",   ".value", "import ", "numpy", " = ", "(x, y)", "\n    ", "for i in range(n):",
      "tensor", "# comment ", "class ", "None",   "True",    ":\n"};
  out.clear();
  while (out.size() < n) {
    uint64_t r = rng.next();
    out += words[r % 16];
    if ((r >> 8) % 4 == 0) out += std::to_string((r >> 16) % 100000);
  }
  out.resize(n);
}

// A safetensors checkpoint of `total` bytes of BF16 tensors of 256 MiB.
void write_checkpoint(const std::string& path, uint64_t total) {
  const uint64_t piece = 256ull << 20;
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  for (int i = 0; off < total; ++i) {
    uint64_t n = std::min(piece, total - off);
    h["layers." + std::to_string(i) + ".weight"] = {
        {"dtype", "BF16"}, {"shape", {n / 2 / 1024, 1024}}, {"data_offsets", {off, off + n / 2 / 1024 * 1024 * 2}}};
    off += n / 2 / 1024 * 1024 * 2;
  }
  std::string hs = h.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');
  fs::create_directories(fs::path(path).parent_path());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  uint64_t len = hs.size();
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[i] = char(len >> (8 * i));
  head += hs;
  if (::write(fd, head.data(), head.size()) != ssize_t(head.size())) throw Error(path + ": write");
  std::vector<char> buf(64 << 20);
  Rng r2(5);
  for (uint64_t w = 0; w < off;) {
    size_t n = size_t(std::min<uint64_t>(buf.size(), off - w));
    r2.fill(buf.data(), n);
    if (::write(fd, buf.data(), n) != ssize_t(n)) throw Error(path + ": write");
    w += n;
  }
  ::close(fd);
}

struct Data {
  std::string root, image, other, cache, lock, ckpt, store, env;
  std::string imports_a, imports_b;
  std::string profile_full, profile_nockpt, profile_wrong, profile_stale;
  std::vector<std::string> install;
};

std::string job_path() { return (fs::read_symlink("/proc/self/exe").parent_path() / "bench_startup_job").string(); }

std::vector<std::string> job_args(const Data& d, const std::string& imports, unsigned striped, bool share) {
  std::vector<std::string> a = {job_path(), "--imports", imports, "--env", d.env, "--ckpt", d.ckpt};
  if (striped) {
    a.push_back("--striped");
    a.push_back(std::to_string(striped));
  }
  if (share) {
    a.push_back("--share");
    a.push_back("1");
  }
  return a;
}

int run_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "ballast startup");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return run_command(nullptr, int(args.size()), argv.data());
}

Data setup(const Config& c) {
  Data d;
  d.root = fs::absolute(c.dir).string();
  d.image = d.root + "/image";
  d.other = d.root + "/other";
  d.cache = d.root + "/pkgcache";
  d.lock = d.root + "/requirements.lock";
  d.ckpt = d.root + "/ckpt/model.safetensors";
  d.store = d.root + "/store";
  d.env = d.root + "/env";
  d.imports_a = d.root + "/imports_a.txt";
  d.imports_b = d.root + "/imports_b.txt";
  d.profile_full = d.root + "/profile_full.json";
  d.profile_nockpt = d.root + "/profile_nockpt.json";
  d.profile_wrong = d.root + "/profile_wrong.json";
  d.profile_stale = d.root + "/profile_stale.json";
  d.install = {"sh", "-c",
               "set -e; mkdir -p \"$BALLAST_ENV_DIR\"; while read -r line; do tar -xzf \"" + d.cache +
                   "/${line%%==*}.tar.gz\" -C \"$BALLAST_ENV_DIR\"; done < \"" + d.lock + "\""};
  const std::string marker = d.root + "/setup-complete";
  if (c.reuse && fs::exists(marker)) return d;  // a data set left by an earlier --keep run
  fs::remove_all(d.root);
  fs::create_directories(d.root);
  double t = now_s();
  if (c.reads_only) {
    write_checkpoint(d.ckpt, c.ckpt_mib << 20);
    ::sync();
    return d;
  }

  // The job's image: imports 75% of it, in a shuffled (import) order.
  auto image = make_tree(d.image, c.files, c.tree_mib, 1);
  std::mt19937_64 gen(2);
  std::shuffle(image.begin(), image.end(), gen);
  image.resize(image.size() * 3 / 4);
  std::ofstream(d.imports_a) << [&] {
    std::string s;
    for (auto& p : image) s += p + "\n";
    return s;
  }();
  // Another job's files, for the wrong profile.
  auto other = make_tree(d.other, c.files / 2, c.tree_mib / 2, 3);
  std::ofstream(d.imports_b) << [&] {
    std::string s;
    for (auto& p : other) s += p + "\n";
    return s;
  }();

  // Packages: 30 tar.gz of 60 text files each; the lockfile names them.
  Rng rng(4);
  std::string text, lock;
  for (int p = 0; p < 30; ++p) {
    std::string name = "package" + std::to_string(p);
    std::string src = d.root + "/pkgsrc/" + name;
    for (int f = 0; f < 60; ++f) {
      fill_text(rng, text, 20000 + rng.next() % 180000);
      write_file(src + "/" + name + "/m" + std::to_string(f) + ".py", text.data(), text.size());
    }
    fs::create_directories(d.cache);
    if (run_process({"tar", "-czf", d.cache + "/" + name + ".tar.gz", "-C", src, name}) != 0)
      throw Error("tar failed for " + name);
    lock += name + "==1." + std::to_string(p) + "\n";
  }
  fs::remove_all(d.root + "/pkgsrc");
  std::ofstream(d.lock) << lock;

  write_checkpoint(d.ckpt, c.ckpt_mib << 20);
  emit("setup", "generate_s", now_s() - t, "s");

  // The snapshot store gets its snapshot the way a first start builds it.
  t = now_s();
  EnvOptions eo;
  eo.lockfiles = {d.lock};
  eo.dir = d.env;
  eo.store = d.store;
  eo.install = d.install;
  EnvResult er = run_env(eo);
  if (er.action != "installed+snapshot") throw Error("setup: env gave " + er.action);
  emit("setup", "install_and_snapshot_s", now_s() - t, "s");
  emit("setup", "env_bytes", double(er.bytes), "B");

  // Profiles recorded from real runs of the jobs.
  if (run_cli({"record", "--profile", d.profile_full, "--", job_path(), "--imports", d.imports_a, "--env", d.env,
               "--ckpt", d.ckpt}) != 0 ||
      run_cli({"record", "--profile", d.profile_nockpt, "--exclude", fs::path(d.ckpt).parent_path().string(), "--",
               job_path(), "--imports", d.imports_a, "--env", d.env}) != 0 ||
      run_cli({"record", "--profile", d.profile_wrong, "--", job_path(), "--imports", d.imports_b}) != 0)
    throw Error("setup: recording a profile failed");
  // A stale profile: every file changed since (as after an image upgrade).
  HotProfile stale = read_profile(d.profile_full);
  for (auto& f : stale.files) f.id.mtime_ns += 1;
  write_profile(d.profile_stale, stale);
  ::sync();
  std::ofstream(marker) << "ok\n";
  return d;
}

std::vector<std::string> all_files(const std::string& root) {
  std::vector<std::string> out;
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) out.push_back(e.path().string());
  return out;
}

// Drops every file of the data set from the page cache; returns the
// fraction of their pages still resident afterwards (mincore).
double make_cold(const Data& d) {
  int dfd = ::open(d.root.c_str(), O_RDONLY | O_DIRECTORY);
  ::syncfs(dfd);
  ::close(dfd);
  uint64_t pages = 0, resident = 0;
  for (const auto& p : all_files(d.root)) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    struct stat st {};
    ::fstat(fd, &st);
    if (st.st_size > 0) {
      void* m = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) {
        size_t n = (size_t(st.st_size) + 4095) / 4096;
        std::vector<unsigned char> v(n);
        if (::mincore(m, size_t(st.st_size), v.data()) == 0)
          for (unsigned char b : v) resident += b & 1;
        pages += n;
        ::munmap(m, size_t(st.st_size));
      }
    }
    ::close(fd);
  }
  return pages ? double(resident) / double(pages) : 0;
}

// Waits until the memory freed by the previous run has gone back to the
// hypervisor. This VM's balloon reports free pages to the host in batches,
// every 2 s, and touching a reported page again costs a host fault (fresh
// memory: about 1.6 s per GiB when reported, 0.35 s per GiB when not). The
// wait must cover the largest amount a run frees: after 2.5 GiB freed, 4 s
// was enough; after the 5 GiB a plain start frees (its buffer and the
// checkpoint's page cache), 4 s left part of it warm and 12 s did not. With
// the 4 s used before, a start after "all" (which frees 2.5 GiB) got cold
// memory and one after any other case warm memory: 7 s against 3.8 s for
// the checkpoint read, charged to whichever case followed "all".
int settle_s = 15;
void settle() { std::this_thread::sleep_for(std::chrono::seconds(settle_s)); }

// Puts the store's snapshot archives at the head of a profile: a node agent
// that is about to restore a snapshot knows it and warms it first, so that
// the restore waits on the CPU only, not on reads queued behind bulk reads.
void warm_snapshot_first(HotProfile& p, const std::string& store) {
  std::vector<HotFile> files;
  std::vector<Extent> extents;
  for (const auto& e : fs::directory_iterator(store)) {
    FileId id;
    if (e.path().extension() != ".bsnap" || !file_id(e.path().string(), id)) continue;
    extents.push_back({uint32_t(files.size()), 0, id.size});
    files.push_back({e.path().string(), id});
  }
  const auto shift = uint32_t(files.size());
  for (auto& x : p.extents) x.file += shift;
  p.files.insert(p.files.begin(), files.begin(), files.end());
  p.extents.insert(p.extents.begin(), extents.begin(), extents.end());
}

// One cold start of the job with the given techniques; seconds, end to end.
//   plain           install from the lockfile, then the job (sequential buffered checkpoint read)
//   snapshot        restore the environment snapshot instead of installing
//   prefetch        hot-block prefetch of the job's recorded profile (checkpoint included) from t0
//   striped         the job loads the checkpoint with 8 striped readers (the loader's default: into the page cache,
//   mapped) all             snapshot + prefetch of the snapshot archive, then of the profile without the
//                   checkpoint + the node's shared striped checkpoint read, started once the
//                   prefetcher is done, which the job then maps
//   prefetch_wrong  prefetch of another job's profile
//   prefetch_stale  prefetch of a profile whose files all changed since
//   striped_prefetch_wrong, striped_prefetch_stale
//                   the same two on top of "striped" (compared with it): a start a third as
//                   long, with less of the fresh-memory cost that spreads the plain starts,
//                   so a fixed cost of the wrong profile weighs more and shows more clearly
struct Run {
  double total = 0, env = 0, imports = 0, ckpt = 0, resident = 0;
  std::string trace;  // counters around the job, for --trace
};

Run start_once(const Data& d, const std::string& c) {
  Run run;
  std::error_code ec;
  fs::remove_all(d.env, ec);
  const std::string stages = d.root + "/stages.jsonl";  // the job's stage log for this run
  fs::remove(stages, ec);
  run.resident = make_cold(d);
  settle();
  const bool snapshot = c == "snapshot" || c == "all";
  const bool striped = c == "striped" || c == "all" || c.rfind("striped_prefetch_", 0) == 0;
  const bool shared = c == "all";
  std::string profile = c == "prefetch"                                          ? d.profile_full
                        : c == "all"                                             ? d.profile_nockpt
                        : c == "prefetch_wrong" || c == "striped_prefetch_wrong" ? d.profile_wrong
                        : c == "prefetch_stale" || c == "striped_prefetch_stale" ? d.profile_stale
                                                                                 : "";
  const double t0 = now_s();
  std::unique_ptr<Prefetcher> pf;
  if (!profile.empty()) {
    HotProfile hot = read_profile(profile);
    if (c == "all") warm_snapshot_first(hot, d.store);
    pf = std::make_unique<Prefetcher>(hot, PrefetchOptions{});
    pf->start();
  }
  // The node's copy of the checkpoint, held until the job has mapped it.
  std::unique_ptr<LoadedFile> node_copy;
  std::thread reader;
  // In "all" the node's read starts once the prefetcher has brought in the
  // hot blocks (the job needs those first): both compete for the device, and
  // the bulk read would otherwise delay the small reads the restore and the
  // imports wait on. It then overlaps the rest of the restore and the imports.
  if (shared)
    reader = std::thread([&] {
      while (!pf->idle()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      LoadOptions o;
      o.share = true;
      node_copy = std::make_unique<LoadedFile>(load_file(d.ckpt, o));
    });
  int rc = 0;
  if (snapshot) {
    EnvOptions eo;
    eo.lockfiles = {d.lock};
    eo.dir = d.env;
    eo.store = d.store;
    eo.install = d.install;
    EnvResult r = run_env(eo);
    if (r.action != "restored") throw Error("snapshot case: " + r.action);
  } else {
    rc = run_process(d.install, {{"BALLAST_ENV_DIR", d.env}});
  }
  run.env = now_s() - t0;
  // Whether the prefetcher had finished its reads before the job started (a
  // wrong profile's whole cost then falls in the environment stage).
  const std::string pf_at_job = pf ? std::string(" prefetch_idle_at_job=") + (pf->idle() ? "1" : "0") : "";
  if (rc == 0) {
    auto args = job_args(d, d.imports_a, striped ? 8 : 0, shared);
    args.push_back("--stages");
    args.push_back(stages);
    auto before = counters();
    struct rusage ru0 {
    }, ru1{};
    ::getrusage(RUSAGE_CHILDREN, &ru0);
    rc = run_process(args, {}, [&](int pid) {
      if (pf) pf->watch(pid);  // a wrong profile stops once the job shows it is not its own
    });
    ::getrusage(RUSAGE_CHILDREN, &ru1);
    auto after = counters();
    std::ostringstream t;
    t << "job_user=" << cpu_s(ru1.ru_utime) - cpu_s(ru0.ru_utime)
      << " job_sys=" << cpu_s(ru1.ru_stime) - cpu_s(ru0.ru_stime);
    for (const char* k : {"MemFree:", "Cached:", "Dirty:", "Writeback:", "Shmem:", "Active(file):", "Inactive(file):"})
      t << " " << k << before[k] / 1024;
    for (const char* k :
         {"pgfault", "pgmajfault", "pgpgin", "pgpgout", "pgfree", "pgalloc_normal", "pgalloc_dma32",
          "workingset_refault_file", "pgscan_kswapd", "compact_stall", "thp_fault_alloc", "nr_dirtied", "nr_written"})
      t << " d_" << k << "=" << after[k] - before[k];
    run.trace = t.str() + pf_at_job;
  }
  if (pf) {
    pf->stop();
    pf->wait();
    run.trace += " prefetched_mib=" + std::to_string(pf->stats().done_bytes >> 20);
  }
  run.total = now_s() - t0;
  if (reader.joinable()) reader.join();
  node_copy.reset();
  if (rc != 0) throw Error("case " + c + ": the job failed with " + std::to_string(rc));
  for (const auto& r : read_stages(stages))
    (r.stage == "imports" ? run.imports : run.ckpt) = double(r.end_ns - r.start_ns) / 1e9;
  return run;
}

// ---- checkpoint read modes --------------------------------------------------

double odirect_read(const std::string& path, unsigned threads, uint64_t req) {
  struct stat st {};
  ::stat(path.c_str(), &st);
  const uint64_t size = uint64_t(st.st_size) / 4096 * 4096;
  const double t0 = now_s();
  std::vector<std::thread> ts;
  std::atomic<uint64_t> next{0};
  for (unsigned i = 0; i < threads; ++i)
    ts.emplace_back([&] {
      int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
      void* buf = nullptr;
      if (fd < 0 || ::posix_memalign(&buf, 4096, req) != 0) return;
      for (;;) {
        uint64_t off = next.fetch_add(req);
        if (off >= size) break;
        if (::pread(fd, buf, std::min(req, size - off), off_t(off)) <= 0) break;
      }
      std::free(buf);
      ::close(fd);
    });
  for (auto& t : ts) t.join();
  return double(size) / (now_s() - t0) / 1e9;
}

// One thread, read() of 8 MiB at a time into a fresh allocation of the
// whole file (what a plain loader does), or into `ready` memory.
double buffered_read(const std::string& path, char* ready = nullptr) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  ::fstat(fd, &st);
  const double t0 = now_s();
  std::unique_ptr<char[]> fresh(ready ? nullptr : new char[size_t(st.st_size)]);
  char* mem = ready ? ready : fresh.get();
  uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd, mem + total, std::min<uint64_t>(8 << 20, uint64_t(st.st_size) - total));
    if (n <= 0) break;
    total += uint64_t(n);
  }
  const double t = now_s() - t0;
  ::close(fd);
  return double(total) / t / 1e9;
}

void drop(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void cold(const std::string& path) {
  drop(path);
  settle();
}

// Cold checkpoint reads, every variant once per round (interleaved, so that
// the machine's load drifts over all of them alike), medians over rounds.
// Every variant reads into memory nobody touched before, except the *_ready_dst
// ones (a destination faulted in beforehand, for comparison only):
//   odirect_*               the ceiling: T threads of O_DIRECT reads of R MiB into small reused buffers
//   buffered_sequential     one read() of 8 MiB at a time into a fresh allocation (a plain loader)
//   striped_N               load_file's default: N readers bring the file into the page cache, mapped
//   striped_8_direct        load_file with O_DIRECT into a fresh anonymous allocation
//   striped_8_16m           as striped_8, 16 MiB chunks
const std::vector<std::string> kReadVariants = {"buffered_sequential",
                                                "striped_8",
                                                "striped_8_direct",
                                                "striped_2",
                                                "striped_4",
                                                "striped_8_16m",
                                                "buffered_sequential_ready_dst",
                                                "striped_8_ready_dst"};
std::vector<std::string> read_variants = {"buffered_sequential", "striped_8", "striped_8_direct"};

void bench_reads(const Data& d, int reps) {
  std::map<std::string, std::vector<double>> r;
  std::vector<double> ceilings;  // per round: the best O_DIRECT variant
  struct stat st {};
  ::stat(d.ckpt.c_str(), &st);
  const uint64_t cap = (uint64_t(st.st_size) + 4095) / 4096 * 4096;
  void* ready = nullptr;  // a destination faulted in beforehand (a trainer's staging buffer)
  const bool need_ready = std::any_of(read_variants.begin(), read_variants.end(),
                                      [](const std::string& v) { return v.find("ready_dst") != std::string::npos; });
  if (need_ready) {
    if (::posix_memalign(&ready, 4096, cap) != 0) throw Error("no memory for the destination");
    std::memset(ready, 0, cap);
  }
  auto load = [&](unsigned stripes, uint64_t chunk, int direct, void* dst) {
    LoadOptions o;
    o.stripes = stripes;
    o.chunk_bytes = chunk;
    o.direct = direct;
    o.destination = dst;
    o.capacity = dst ? cap : 0;
    LoadedFile f = load_file(d.ckpt, o);
    return double(f.size) / f.seconds / 1e9;
  };
  for (int i = 0; i < reps; ++i) {
    double ceiling = 0;
    // 8: the queue depth of 8 striped readers
    for (auto [t, req] :
         std::vector<std::pair<unsigned, uint64_t>>{{1, 16 << 20}, {4, 16 << 20}, {8, 8 << 20}, {8, 16 << 20}}) {
      cold(d.ckpt);
      double v = odirect_read(d.ckpt, t, req);
      r["odirect_" + std::to_string(t) + "t_" + std::to_string(req >> 20) + "m"].push_back(v);
      ceiling = std::max(ceiling, v);
    }
    ceilings.push_back(ceiling);
    for (const std::string& v : read_variants) {
      cold(d.ckpt);
      double x = v == "buffered_sequential"             ? buffered_read(d.ckpt)
                 : v == "buffered_sequential_ready_dst" ? buffered_read(d.ckpt, static_cast<char*>(ready))
                 : v == "striped_8_direct"              ? load(8, 8 << 20, 1, nullptr)
                 : v == "striped_8_16m"                 ? load(8, 16 << 20, -1, nullptr)
                 : v == "striped_8_ready_dst"           ? load(8, 8 << 20, -1, ready)
                                                        : load(unsigned(std::stoul(v.substr(8))), 8 << 20, -1, nullptr);
      r[v].push_back(x);
      emit("ckpt_read", v + "_round" + std::to_string(i + 1) + "_vs_ceiling", x / ceiling, "ratio");
    }
    emit("ckpt_read", "device_ceiling_round" + std::to_string(i + 1), ceiling, "GB/s");
  }
  std::free(ready);
  for (auto& [k, v] : r) emit("ckpt_read", k, median(v), "GB/s");
  // The ceiling: the best median of the O_DIRECT variants; "paired": the
  // median over rounds of the variant against the best O_DIRECT read of its round.
  double ceiling = 0;
  for (auto& [k, v] : r)
    if (k.rfind("odirect_", 0) == 0) ceiling = std::max(ceiling, median(v));
  emit("ckpt_read", "device_ceiling", ceiling, "GB/s");
  for (const std::string& v : read_variants) {
    if (v.find("ready_dst") != std::string::npos || v == "buffered_sequential") continue;
    emit("ckpt_read", v + "_vs_ceiling", median(r[v]) / ceiling, "ratio");
    std::vector<double> paired;
    for (size_t i = 0; i < r[v].size(); ++i) paired.push_back(r[v][i] / ceilings[i]);
    emit("ckpt_read", v + "_vs_ceiling_paired", median(paired), "ratio");
    if (r.count("buffered_sequential"))
      emit("ckpt_read", v + "_vs_buffered_sequential", median(r[v]) / median(r["buffered_sequential"]), "ratio");
  }
  if (r.count("striped_8_ready_dst") && r.count("buffered_sequential_ready_dst"))
    emit("ckpt_read", "striped_8_ready_dst_vs_buffered_sequential_ready_dst",
         median(r["striped_8_ready_dst"]) / median(r["buffered_sequential_ready_dst"]), "ratio");
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  std::vector<std::string> known_cases = c.cases;
  known_cases.insert(known_cases.end(), c.extra_cases.begin(), c.extra_cases.end());
  std::vector<std::string> cases;
  CLI::App app(
      "A cold job start on this machine, plain and with each start-up technique alone and together, "
      "plus the checkpoint read modes against the device's O_DIRECT ceiling; JSON lines on stdout "
      "(docs/benchmarks.md).",
      "bench_startup");
  app.add_option("--dir", c.dir, "where the data set is made (default startup-bench)");
  app.add_option("--reps", c.reps, "rounds (default 3)")->check(CLI::PositiveNumber);
  app.add_option("--ckpt-mib", c.ckpt_mib, "checkpoint size (default 2560)")->check(CLI::PositiveNumber);
  app.add_option("--tree-mib", c.tree_mib, "size of the imported tree (default 300)")->check(CLI::PositiveNumber);
  app.add_option("--files", c.files, "files of the imported tree (default 4000)")->check(CLI::PositiveNumber);
  app.add_flag("--keep", c.keep, "keep the data set in DIR");
  app.add_flag("--reuse", c.reuse, "use the data set an earlier --keep run left in DIR (implies --keep)");
  app.add_flag("--trace", c.trace, "per start, on stderr: memory counters and the job's CPU time");
  app.add_option("--settle", settle_s, "seconds of pause after each drop (default 15)")->check(CLI::NonNegativeNumber);
  app.add_flag("--reads-only", c.reads_only, "the checkpoint read modes only");
  app.add_flag("--no-reads", c.no_reads, "the start cases only");
  app.add_option("--cases", cases,
                 "a subset of the start cases (plain, or striped for the striped_prefetch_* "
                 "ones, is always run: the base they are compared with)")
      ->delimiter(',')
      ->check(CLI::IsMember(known_cases));
  app.add_option("--reads", read_variants,
                 "checkpoint read variants beside the O_DIRECT ceiling (default "
                 "buffered_sequential,striped_8,striped_8_direct)")
      ->delimiter(',')
      ->check(CLI::IsMember(kReadVariants));
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  if (c.reuse) c.keep = true;
  if (!cases.empty()) {
    c.cases = cases;
    // Every case is compared with plain, the striped_prefetch_* ones with striped.
    auto add = [&](const char* base) {
      if (std::find(c.cases.begin(), c.cases.end(), base) == c.cases.end()) c.cases.insert(c.cases.begin(), base);
    };
    bool need_plain = false, need_striped = false;
    for (const auto& one : c.cases) (one.rfind("striped_prefetch_", 0) == 0 ? need_striped : need_plain) = true;
    if (need_striped) add("striped");
    if (need_plain) add("plain");
  }
  try {
    emit("machine", "loadavg_1m_start", loadavg(), "load");
    Data d = setup(c);
    if (!c.no_reads) {
      bench_reads(d, c.reps);
      emit("machine", "loadavg_1m_after_reads", loadavg(), "load");
    }
    if (c.reads_only) {
      if (!c.keep) fs::remove_all(d.root);
      return 0;
    }
    const std::vector<std::string>& cases = c.cases;
    std::map<std::string, std::vector<Run>> runs;
    std::map<std::string, std::vector<double>> times;
    double worst_resident = 0;
    for (int r = 0; r < c.reps; ++r) {
      // Interleaved, so that drift hits every case alike, in a new order each
      // round: rotating one fixed order would put each case after the same
      // predecessor in every round but one, and charge it whatever that one
      // leaves behind.
      std::vector<std::string> order = cases;
      std::mt19937_64 gen(uint64_t(r) + 11);
      std::shuffle(order.begin(), order.end(), gen);
      for (const std::string& cs : order) {
        Run run = start_once(d, cs);
        if (c.trace)
          std::fprintf(stderr, "trace round=%d case=%s total=%.2f env=%.2f imports=%.2f ckpt=%.2f %s\n", r, cs.c_str(),
                       run.total, run.env, run.imports, run.ckpt, run.trace.c_str());
        runs[cs].push_back(run);
        times[cs].push_back(run.total);
        worst_resident = std::max(worst_resident, run.resident);
      }
    }
    emit("cold", "max_resident_after_drop", 100 * worst_resident, "%");
    const double plain = times.count("plain") ? median(times["plain"]) : 0;
    for (const auto& cs : cases) {
      double m = median(times[cs]);
      emit(cs, "end_to_end_s", m, "s");
      for (size_t i = 0; i < times[cs].size(); ++i)  // every run, to judge the spread
        emit(cs, "run" + std::to_string(i + 1) + "_end_to_end_s", times[cs][i], "s");
      std::vector<double> env, imp, ck;
      for (const auto& run : runs[cs]) {
        env.push_back(run.env);
        imp.push_back(run.imports);
        ck.push_back(run.ckpt);
      }
      emit(cs, "environment_s", median(env), "s");
      emit(cs, "imports_s", median(imp), "s");
      emit(cs, "checkpoint_load_s", median(ck), "s");
      const std::string base = cs.rfind("striped_prefetch_", 0) == 0 ? "striped" : "plain";
      if (cs != base && times.count(base)) {
        emit(cs, "vs_" + base, m / median(times[base]), "ratio");
        // Against the base start of the same round (run minutes apart at
        // most), which cancels the machine's slow drift: median of the ratios.
        std::vector<double> paired;
        for (size_t i = 0; i < times[cs].size(); ++i) paired.push_back(times[cs][i] / times[base][i]);
        emit(cs, "vs_" + base + "_paired", median(paired), "ratio");
      }
    }
    if (times.count("all")) {
      emit("all", "startup_cut", 1 - median(times["all"]) / plain, "fraction");
      std::vector<double> cut;
      for (size_t i = 0; i < times["all"].size(); ++i) cut.push_back(1 - times["all"][i] / times["plain"][i]);
      emit("all", "startup_cut_paired", median(cut), "fraction");
    }
    emit("machine", "loadavg_1m_end", loadavg(), "load");
    if (!c.keep) fs::remove_all(d.root);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_startup: %s\n", e.what());
    return 1;
  }
  return 0;
}
