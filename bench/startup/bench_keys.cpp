// bench_startup_keys: the cost of the start-up plugin's SHA-256 keys: a
// dependency snapshot's key (environment_key over a lockfile) and a shared
// checkpoint load's segment name (a short id), against CRC-32C over the same
// bytes, measured in the same run (the ceiling of reading them once).
// One JSON object per line {"bench","case","metric","value","unit"}; each
// figure the median of --runs.
#include "command_line.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "snapshot.hpp"
#include "util.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

void emit(const std::string& c, const std::string& metric, double value, const std::string& unit) {
  std::printf("{\"bench\":\"startup_keys\",\"case\":\"%s\",\"metric\":\"%s\",\"value\":%.6g,\"unit\":\"%s\"}\n",
              c.c_str(), metric.c_str(), value, unit.c_str());
  std::fflush(stdout);
}

// Seconds per call of fn, median of runs of iters calls each.
template <class Fn>
double per_call(int runs, int iters, Fn fn) {
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / iters);
  }
  return median(t);
}

volatile uint32_t g_sink;

}  // namespace

int main(int argc, char** argv) {
  int runs = 9;
  CLI::App app(
      "The start-up plugin's SHA-256 keys (snapshot key over a lockfile, shared-load segment name) "
      "against CRC-32C over the same bytes; JSON lines on stdout (docs/benchmarks.md).",
      "bench_startup_keys");
  app.add_option("--runs", runs, "runs per figure (the median is reported; default 9)")->check(CLI::PositiveNumber);
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;

  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("bench-startup-keys-" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (size_t kib : {4, 1024}) {
    const std::string lock = (dir / ("lock-" + std::to_string(kib))).string();
    std::string text;
    for (size_t i = 0; text.size() < kib * 1024; ++i)
      text += "package-" + std::to_string(i) + "==1.2." + std::to_string(i % 97) + "\n";
    text.resize(kib * 1024);
    std::ofstream(lock) << text;
    const std::string c = "environment_key_" + std::to_string(kib) + "kib";
    const int iters = kib >= 1024 ? 20 : 2000;
    const double key = per_call(runs, iters, [&] {
      g_sink = uint32_t(ballast::startup::environment_key({lock}, "linux-x86_64", dir.string()).size());
    });
    const double sha = per_call(runs, iters, [&] {
      ballast::startup::Sha256 h;
      h.update(text.data(), text.size());
      g_sink = uint32_t(h.hex().size());
    });
    const double crc = per_call(runs, iters, [&] { g_sink = ballast::startup::crc32c(text.data(), text.size()); });
    emit(c, "us_per_key", key * 1e6, "us");
    emit(c, "sha256_mb_per_s", double(text.size()) / sha / 1e6, "MB/s");
    emit(c, "crc32c_mb_per_s", double(text.size()) / crc / 1e6, "MB/s");
    emit(c, "sha256_vs_crc32c", crc / sha, "ratio");
  }
  const std::string id =
      "/data/checkpoints/step-12000/model-00001-of-00008.safetensors|2049|1837465|4294967296|"
      "1732456789.123456789|8388608";
  const double seg = per_call(runs, 100000, [&] {
    ballast::startup::Sha256 h;
    h.update(id.data(), id.size());
    g_sink = uint32_t(h.hex().size());
  });
  emit("segment_name", "ns_per_name", seg * 1e9, "ns");
  fs::remove_all(dir);
  return 0;
}
