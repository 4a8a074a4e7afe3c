#include "startup_command.hpp"

#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "command_line.hpp"
#include "hotblocks.hpp"
#include "progress.hpp"
#include "snapshot.hpp"
#include "stages.hpp"
#include "striped_read.hpp"
#include "util.hpp"

namespace fs = std::filesystem;

namespace ballast::startup {

namespace {

const char* kFooter =
    "Commands that run a program take it after --: ballast startup time STAGE -- CMD ARGS...\n"
    "--stages FILE appends stage timings (default: $BALLAST_STARTUP_STAGES).\n"
    "Run 'ballast startup COMMAND --help' for a command's options.";

// Splits argv at the first "--": options before, the command after.
void split_command(int argc, char** argv, std::vector<std::string>& opts, std::vector<std::string>& cmd) {
  bool after = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (!after && a == "--") {
      after = true;
      continue;
    }
    (after ? cmd : opts).push_back(a);
  }
}

// The interposer library: $BALLAST_STARTUP_RECORD_LIB, else next to this
// plugin (lib/ballast/), else where the build put it.
std::string interposer_library() {
  if (const char* env = std::getenv("BALLAST_STARTUP_RECORD_LIB")) return env;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&interposer_library), &info) != 0 && info.dli_fname != nullptr) {
    fs::path here = fs::path(info.dli_fname).parent_path();
    for (const fs::path& p :
         {here / "libballast-startup-record.so", here.parent_path() / "libballast-startup-record.so"})
      if (fs::exists(p)) return p.string();
  }
#ifdef BALLAST_STARTUP_RECORD_LIB_DEFAULT
  return BALLAST_STARTUP_RECORD_LIB_DEFAULT;
#else
  return "";
#endif
}

StageRecord stage(const std::string& name, int64_t start, uint64_t bytes, int status, std::string detail) {
  StageRecord r;
  r.stage = name;
  r.start_ns = start;
  r.end_ns = wall_ns();
  r.bytes = bytes;
  r.status = status;
  r.detail = std::move(detail);
  return r;
}

struct ReportArgs {
  bool json = false;
  std::string file;
};

void add_report(CLI::App& top, ReportArgs& a) {
  CLI::App* app = top.add_subcommand("report", "where the start-up time went");
  app->add_flag("--json", a.json, "one JSON object");
  app->add_option("FILE", a.file, "stage log (JSON lines)")->required();
}

int cmd_report(const ReportArgs& a) {
  const bool json = a.json;
  const std::string& file = a.file;
  nlohmann::json rep = stage_report(read_stages(file));
  rep["file"] = file;
  std::fputs(json ? (rep.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n").c_str()
                  : stage_report_text(rep).c_str(),
             stdout);
  return 0;
}

struct RecordArgs {
  std::string profile = "ballast-startup.profile.json";
  uint64_t block_kib = 256;
  std::vector<std::string> exclude;
};

void add_record(CLI::App& top, RecordArgs& a) {
  CLI::App* app = top.add_subcommand("record", "record the blocks a command reads (the command after --)");
  app->add_option("--profile", a.profile, "hot-block profile to write");
  app->add_option("--exclude", a.exclude, "leave out files under this path prefix (repeatable)");
  app->add_option("--block-kib", a.block_kib, "block size in KiB (power of two)");
}

int cmd_record(RecordArgs a, const std::vector<std::string>& cmd) {
  const std::string& profile = a.profile;
  const uint64_t block_kib = a.block_kib;
  std::vector<std::string>& exclude = a.exclude;
  std::string lib = interposer_library();
  if (lib.empty() || !fs::exists(lib)) {
    std::fprintf(stderr, "ballast startup record: interposer library not found (%s); set BALLAST_STARTUP_RECORD_LIB\n",
                 lib.c_str());
    return 1;
  }
  std::string access_log = profile + ".reads." + std::to_string(::getpid());
  std::string preload = lib;
  if (const char* old = std::getenv("LD_PRELOAD"); old != nullptr && *old != '\0') preload += std::string(":") + old;
  int rc = run_process(cmd, {{"LD_PRELOAD", preload}, {"BALLAST_STARTUP_RECORD", access_log}});
  if (rc != 0) std::fprintf(stderr, "ballast startup record: the command exited with %d; profile kept anyway\n", rc);
  if (!fs::exists(access_log)) {
    std::fprintf(stderr,
                 "ballast startup record: the command read no regular file through the interposer "
                 "(statically linked, or reads only through stdio?)\n");
    std::ofstream(access_log).close();
  }
  for (auto& e : exclude) e = fs::absolute(e).lexically_normal().string();
  HotProfile p = profile_from_access_log(access_log, block_kib * 1024, exclude);
  std::remove(access_log.c_str());
  write_profile(profile, p);
  std::printf("recorded %zu files, %zu extents, %s in first-need order -> %s\n", p.files.size(), p.extents.size(),
              human_bytes(double(p.bytes())).c_str(), profile.c_str());
  return rc;
}

struct PrefetchArgs {
  std::string profile, stages;
  PrefetchOptions o;
  uint64_t budget_mib = 0;
  bool json = false;
};

void add_prefetch(CLI::App& top, PrefetchArgs& a) {
  CLI::App* app = top.add_subcommand("prefetch",
                                     "warm the page cache from a hot-block profile (while the command "
                                     "after -- runs)");
  app->add_option("PROFILE", a.profile, "hot-block profile")->required();
  app->add_option("--threads", a.o.threads, "parallel readers");
  app->add_option("--budget-mib", a.budget_mib, "most bytes to prefetch (default: half of MemAvailable)");
  app->add_option("--stages", a.stages, "stage log to append to");
  app->add_flag("--json", a.json, "print the outcome as JSON");
}

int cmd_prefetch(const ballast_host_api* host, PrefetchArgs a, const std::vector<std::string>& cmd) {
  const std::string &profile = a.profile, &stages = a.stages;
  PrefetchOptions& o = a.o;
  const uint64_t budget_mib = a.budget_mib;
  const bool json = a.json;
  o.budget_bytes = budget_mib << 20;
  StageLog log(host, stages);
  const int64_t t0 = wall_ns();
  HotProfile p;
  try {
    p = read_profile(profile);
  } catch (const Error& e) {
    // A bad profile must never keep the job from starting.
    std::fprintf(stderr, "ballast startup prefetch: %s; not prefetching\n", e.what());
    return cmd.empty() ? 1 : run_process(cmd);
  }
  Prefetcher pf(p, o);
  pf.start();
  int rc = 0;
  if (!cmd.empty()) {
    rc = run_process(cmd, {}, [&](int pid) { pf.watch(pid); });
    pf.stop();  // the job is over: what is left is no longer needed
  } else {
    // Alone, on a terminal: how far, how fast, how long yet (the job's own
    // output would mix with it, so not while a command runs).
    util::ProgressLine progress(stderr, "ballast startup prefetch", true, json);
    while (!pf.idle()) {
      progress.update(double(pf.done_bytes()), double(pf.planned_bytes()));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  pf.wait();
  const PrefetchStats& s = pf.stats();
  for (const auto& m : s.messages) std::fprintf(stderr, "ballast startup prefetch: %s\n", m.c_str());
  log.record(stage("file_warmup", t0, s.done_bytes, s.errors ? BALLAST_EIO : BALLAST_OK,
                   std::to_string(s.files_ok) + " files, " + std::to_string(s.files_skipped) + " skipped"));
  if (json) {
    nlohmann::json j = {{"profile", profile},
                        {"files", s.files_ok},
                        {"skipped", s.files_skipped},
                        {"planned_bytes", s.planned_bytes},
                        {"done_bytes", s.done_bytes},
                        {"budget_cut_bytes", s.budget_cut_bytes},
                        {"errors", s.errors},
                        {"stopped_early", s.stopped_early},
                        {"seconds", double(wall_ns() - t0) / 1e9},
                        {"messages", s.messages}};
    if (!cmd.empty()) j["exit_code"] = rc;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::fprintf(stderr, "ballast startup prefetch: %s of %s prefetched from %zu files (%zu skipped)%s\n",
                 human_bytes(double(s.done_bytes)).c_str(), human_bytes(double(s.planned_bytes)).c_str(), s.files_ok,
                 s.files_skipped, s.stopped_early ? ", stopped when the job ended" : "");
  }
  return cmd.empty() ? (s.errors ? 1 : 0) : rc;
}

struct EnvArgs {
  EnvOptions o;
  std::string stages;
  uint64_t cap_mib = 20480;
  bool json = false;
};

void add_env(CLI::App& top, EnvArgs& a) {
  CLI::App* app = top.add_subcommand("env", "restore or build a dependency snapshot (the install command after --)");
  app->add_option("--lock", a.o.lockfiles, "lockfile(s) the key is made of")->required();
  app->add_option("--dir", a.o.dir, "environment directory the install fills")->required();
  app->add_option("--store", a.o.store, "snapshot store directory")->required();
  app->add_option("--cap-mib", a.cap_mib, "size cap of the store (LRU eviction)");
  app->add_option("--platform", a.o.platform, "platform string in the key (default: OS, CPU, glibc)");
  app->add_option("--stages", a.stages, "stage log to append to");
  app->add_flag("--json", a.json, "print the outcome as JSON");
}

int cmd_env(const ballast_host_api* host, EnvArgs a, const std::vector<std::string>& cmd) {
  EnvOptions& o = a.o;
  const std::string& stages = a.stages;
  const uint64_t cap_mib = a.cap_mib;
  const bool json = a.json;
  o.cap_bytes = cap_mib << 20;
  o.install = cmd;
  StageLog log(host, stages);
  const int64_t t0 = wall_ns();
  EnvResult r = run_env(o);
  for (const auto& m : r.messages) std::fprintf(stderr, "ballast startup env: %s\n", m.c_str());
  log.record(stage("environment", t0, r.bytes, r.exit_code == 0 ? BALLAST_OK : BALLAST_EPLUGIN,
                   r.action + (r.key.empty() ? "" : " " + r.key)));
  if (json)
    std::printf("%s\n", nlohmann::json({{"action", r.action},
                                        {"key", r.key},
                                        {"bytes", r.bytes},
                                        {"exit_code", r.exit_code},
                                        {"seconds", double(wall_ns() - t0) / 1e9},
                                        {"messages", r.messages}})
                            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                            .c_str());
  else
    std::fprintf(stderr, "ballast startup env: %s (%s)\n", r.action.c_str(), r.key.c_str());
  return r.exit_code;
}

struct LoadArgs {
  std::vector<std::string> files;
  LoadOptions o;
  uint64_t chunk_mib = 8;
  bool direct = false, buffered = false, no_verify = false, write = false, json = false;
  std::string stages;
};

void add_load(CLI::App& top, LoadArgs& a) {
  CLI::App* app = top.add_subcommand("load", "striped checkpoint reads");
  app->add_option("FILE", a.files, "safetensors or raw shard files")->required();
  app->add_option("--stripes", a.o.stripes, "parallel readers per file");
  app->add_option("--chunk-mib", a.chunk_mib, "stripe unit in MiB");
  app->add_flag("--direct", a.direct,
                "O_DIRECT into a fresh allocation (default: map the file, read it into the page cache)");
  app->add_flag("--buffered", a.buffered, "never O_DIRECT (the default: map the file, read it into the page cache)");
  app->add_flag("--share", a.o.share, "share one read among the processes of this node (/dev/shm)");
  app->add_flag("--no-verify", a.no_verify, "ignore FILE.crc32c");
  app->add_flag("--write-sums", a.write, "write FILE.crc32c after loading");
  app->add_option("--stages", a.stages, "stage log to append to");
  app->add_flag("--json", a.json, "one JSON object per file");
}

// load_file on another thread while this one redraws the progress line
// (ProgressLine is the main thread's).
LoadedFile load_with_progress(const std::string& path, const LoadOptions& o, util::ProgressLine& progress,
                              const std::atomic<uint64_t>& read_bytes, uint64_t all_bytes) {
  LoadedFile f;
  std::exception_ptr error;
  std::atomic<bool> done{false};
  std::thread loader([&] {
    try {
      f = load_file(path, o);
    } catch (...) {
      error = std::current_exception();
    }
    done.store(true);
  });
  do {  // drawn at least once, however fast the load
    progress.update(double(read_bytes.load()), double(all_bytes));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (!done.load());
  loader.join();
  if (error) std::rethrow_exception(error);
  return f;
}

int cmd_load(const ballast_host_api* host, LoadArgs a) {
  const std::vector<std::string>& files = a.files;
  LoadOptions& o = a.o;
  const uint64_t chunk_mib = a.chunk_mib;
  const bool direct = a.direct, buffered = a.buffered, no_verify = a.no_verify, write = a.write, json = a.json;
  const std::string& stages = a.stages;
  o.chunk_bytes = chunk_mib << 20;
  o.direct = direct ? 1 : buffered ? 0 : -1;
  o.verify = !no_verify;
  StageLog log(host, stages);
  const int64_t t0 = wall_ns();
  uint64_t total = 0;
  int rc = 0;
  // On a terminal: the bytes of all the files read so far, rate, time left.
  util::ProgressLine progress(stderr, "ballast startup load", true, json);
  std::atomic<uint64_t> read_bytes{0};
  uint64_t all_bytes = 0;
  if (progress.active()) {
    o.progress_bytes = &read_bytes;
    for (const auto& path : files) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(path, ec);
      if (!ec) all_bytes += size;
    }
  }
  for (const auto& path : files) {
    try {
      LoadedFile f =
          progress.active() ? load_with_progress(path, o, progress, read_bytes, all_bytes) : load_file(path, o);
      progress.clear();
      if (write) write_sums(f);
      total += f.size;
      double gbs = f.seconds > 0 ? double(f.size) / f.seconds / 1e9 : 0;
      if (json) {
        nlohmann::json j = {{"file", path},           {"bytes", f.size},
                            {"seconds", f.seconds},   {"gbytes_per_s", gbs},
                            {"checksum", f.checksum}, {"chunk_bytes", f.chunk_bytes},
                            {"direct", f.direct},     {"mapped", f.mapped},
                            {"shared", f.shared},     {"read_here", f.read_here},
                            {"verified", f.verified}, {"tensors", f.header.tensors.size()}};
        std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      } else {
        std::printf("%s: %s in %.3f s (%.2f GB/s), %zu tensors, crc32c/chunks %08x%s%s%s%s\n", path.c_str(),
                    human_bytes(double(f.size)).c_str(), f.seconds, gbs, f.header.tensors.size(), f.checksum,
                    f.verified ? ", verified" : "", f.direct ? ", O_DIRECT" : "", f.mapped ? ", mapped" : "",
                    f.shared ? (f.read_here ? ", shared (read here)" : ", shared (mapped)") : "");
      }
    } catch (const Error& e) {
      progress.clear();
      std::fprintf(stderr, "ballast startup load: %s\n", e.what());
      rc = 1;
    }
  }
  log.record(stage("checkpoint_load", t0, total, rc == 0 ? BALLAST_OK : BALLAST_EIO,
                   std::to_string(files.size()) + " files, " + std::to_string(o.stripes) + " stripes"));
  return rc;
}

struct TimeArgs {
  std::string name, stages;
};

void add_time(CLI::App& top, TimeArgs& a) {
  CLI::App* app = top.add_subcommand("time", "time the command after -- as one start-up stage");
  app->add_option("STAGE", a.name, "stage name (comm_init, first_step, ...)")->required();
  app->add_option("--stages", a.stages, "stage log to append to");
}

int cmd_time(const ballast_host_api* host, const TimeArgs& a, const std::vector<std::string>& cmd) {
  const std::string &name = a.name, &stages = a.stages;
  StageLog log(host, stages);
  const int64_t t0 = wall_ns();
  int rc = run_process(cmd);
  log.record(stage(name, t0, 0, rc == 0 ? BALLAST_OK : BALLAST_EPLUGIN, "exit " + std::to_string(rc)));
  return rc;
}

}  // namespace

int run_command(const ballast_host_api* host, int argc, char** argv) {
  CLI::App app(
      "Start-up optimiser: stage profile, hot-block prefetch, dependency snapshots, striped checkpoint "
      "loads.",
      "ballast startup");
  app.require_subcommand(1);
  ReportArgs report;
  RecordArgs record;
  PrefetchArgs prefetch;
  EnvArgs env;
  LoadArgs load;
  TimeArgs timing;
  add_report(app, report);
  add_record(app, record);
  add_prefetch(app, prefetch);
  add_env(app, env);
  add_load(app, load);
  add_time(app, timing);
  app.footer(kFooter);
  std::vector<std::string> opts, cmd;
  split_command(argc - 1, argv + 1, opts, cmd);
  if (int rc = util::parse_command_line(app, opts); rc >= 0) return rc;
  CLI::App* verb = app.get_subcommands().front();
  const std::string sub = verb->get_name();
  const bool takes_command = sub == "record" || sub == "prefetch" || sub == "env" || sub == "time";
  if (!takes_command && !cmd.empty()) return util::usage_error(app, "takes no command after --");
  if (takes_command && cmd.empty() && sub != "prefetch") return util::usage_error(app, "missing the command after --");
  try {
    if (sub == "report") return cmd_report(report);
    if (sub == "record") return cmd_record(record, cmd);
    if (sub == "prefetch") return cmd_prefetch(host, prefetch, cmd);
    if (sub == "env") return cmd_env(host, env, cmd);
    if (sub == "load") return cmd_load(host, load);
    return cmd_time(host, timing, cmd);
  } catch (const Error& e) {
    std::fprintf(stderr, "ballast startup %s: %s\n", sub.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ballast startup %s: %s\n", sub.c_str(), e.what());
    return 1;
  }
}

}  // namespace ballast::startup
