// `ballast detect` on metrics named as the usual exporters name them: the
// DCGM exporter and node-exporter (labelled series, quoted in the CSV,
// counters cumulative) and plain names. A faulty machine is found; a file
// whose names match nothing says so instead of reporting silence.
#include <doctest/doctest.h>

#include "detect_command.hpp"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace ballast::machine;

namespace {

struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const auto& p : paths) std::remove(p.c_str());
  }
} temp_files;

std::string write_file(const std::string& name, const std::string& text) {
  std::string p = "machine_names_" + std::to_string(getpid()) + "_" + name;
  temp_files.paths.push_back(p);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

struct Run {
  int code;
  std::string out, err;
};
Run run_detect(std::vector<std::string> args) {
  args.insert(args.begin(), "ballast detect");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string out = write_file("stdout", ""), err = write_file("stderr", "");
  std::fflush(stdout);
  std::fflush(stderr);
  int saved_out = dup(1), saved_err = dup(2);
  FILE* fo = std::fopen(out.c_str(), "w");
  FILE* fe = std::fopen(err.c_str(), "w");
  dup2(fileno(fo), 1);
  dup2(fileno(fe), 2);
  int code = detect_main(static_cast<int>(args.size()), argv.data());
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  close(saved_out);
  close(saved_err);
  std::fclose(fo);
  std::fclose(fe);
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  return {code, slurp(out), slurp(err)};
}

std::vector<nlohmann::json> lines(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) v.push_back(nlohmann::json::parse(line));
  return v;
}

// 10 machines, 60 s at 1 s. node4's NIC retransmits from t = 30 and its GPU
// 1 is capped (clock 1500 instead of 1980); everything else alike.
std::string exporter_csv() {
  std::mt19937 rng(5);
  std::normal_distribution<double> noise(0, 1);
  std::ostringstream s;
  s << std::fixed << std::setprecision(3) << "ts,node,metric,value\n";
  std::vector<double> retrans(10, 1000), tx(10, 1e12);
  for (int t = 0; t < 60; ++t)
    for (int i = 0; i < 10; ++i) {
      bool bad = i == 4 && t >= 30;
      double ts = 1700000000 + t + 0.01 * i;
      for (int g = 0; g < 2; ++g) {
        s << ts << ",node" << i << ",\"DCGM_FI_DEV_SM_CLOCK{gpu=\"\"" << g << "\"\",UUID=\"\"GPU-" << i << g
          << "\"\"}\"," << (bad && g == 1 ? 1500 : 1980) + 3 * noise(rng) << "\n";
        s << ts << ",node" << i << ",\"DCGM_FI_DEV_GPU_UTIL{gpu=\"\"" << g << "\"\"}\"," << 95 + 2 * noise(rng) << "\n";
      }
      retrans[i] += bad ? 300 : (rng() % 3);
      tx[i] += 1e9 * (1 + 0.02 * noise(rng));
      s << ts << ",node" << i << ",node_netstat_Tcp_RetransSegs," << retrans[i] << "\n";
      s << ts << ",node" << i << ",\"node_network_transmit_bytes_total{device=\"\"ib0\"\"}\"," << tx[i] << "\n";
    }
  return s.str();
}

}  // namespace

TEST_CASE("DCGM exporter and node-exporter names: the faulty machine is found") {
  std::string csv = write_file("exporter.csv", exporter_csv());
  Run r = run_detect({"--metrics", csv, "--json"});
  REQUIRE(r.code == 0);
  auto v = lines(r.out);
  REQUIRE(v.size() == 2);
  CHECK(v[0]["node"] == "node4");
  CHECK(v[0]["kind"] == "outlier");
  CHECK(v[0]["metric"] == "gpu1.sm_clock");  // the GPU comes before the network in the priority order
  CHECK(v[0]["ts"].get<double>() > 1700000030);
  CHECK(v[0]["ts"].get<double>() < 1700000033);
  CHECK(v[1]["kind"] == "summary");
  CHECK(v[1]["exporter_names_mapped"] == 24);  // distinct series texts (UUIDs differ)
  CHECK(v[1]["series_ignored"] == 0);
  CHECK(v[1]["series_checked"] == 60);  // 6 detector metrics x 10 machines
  r = run_detect({"--metrics", csv});
  CHECK(r.out.find("24 exporter names mapped") != std::string::npos);
  CHECK(r.err.empty());
}

TEST_CASE("plain names (gpu_util, net_tx_gbps) are understood too") {
  std::mt19937 rng(9);
  std::normal_distribution<double> noise(0, 1);
  std::ostringstream s;
  s << "ts,node,metric,value\n";
  for (int t = 0; t < 40; ++t)
    for (int i = 0; i < 8; ++i) {
      s << 1700000000 + t << ",n" << i << ",gpu_util," << (i == 6 && t >= 20 ? 20 : 95) + 2 * noise(rng) << "\n";
      s << 1700000000 + t << ",n" << i << ",net_tx_gbps," << 100 + 3 * noise(rng) << "\n";
    }
  Run r = run_detect({"--metrics", write_file("plain.csv", s.str()), "--json"});
  REQUIRE(r.code == 0);
  auto v = lines(r.out);
  REQUIRE(v.size() == 2);
  CHECK(v[0]["node"] == "n6");
  CHECK(v[0]["metric"] == "gpu.util");
}

TEST_CASE("a file whose names match no pattern warns instead of looking healthy") {
  std::ostringstream s;
  s << "ts,node,metric,value\n";
  for (int t = 0; t < 20; ++t)
    for (int i = 0; i < 5; ++i) s << t << ",n" << i << ",my_trainer_loss," << (i == 2 ? 9 : 1) << "\n";
  std::string csv = write_file("unknown.csv", s.str());
  Run r = run_detect({"--metrics", csv, "--json"});
  REQUIRE(r.code == 0);
  auto v = lines(r.out);
  REQUIRE(v.size() == 1);
  CHECK(v[0]["kind"] == "summary");
  CHECK(v[0]["series_checked"] == 0);
  CHECK(v[0]["series_ignored"] == 5);
  CHECK(v[0]["warning"].get<std::string>().find("'my_trainer_loss'") != std::string::npos);
  CHECK(r.err.find("warning: no series matched the metric list") != std::string::npos);
  r = run_detect({"--metrics", csv});
  CHECK(r.out.find("0 series checked (0 metrics), 5 series ignored by the metric list (1 metrics)") !=
        std::string::npos);
  CHECK(r.err.find("warning") != std::string::npos);
}
