// The job channel's executor side: reports parsed (and bad ones refused with
// the field named), datagrams over a real socket, commands appended as lines,
// checkpoints found by step.
#include <doctest/doctest.h>

#include "channel.hpp"
#include "checkpoints.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

using namespace ballast::runner;

namespace {
std::string scratch(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}
}  // namespace

TEST_CASE("reports of every type parse") {
  std::string err;
  auto h = parse_report(R"({"type":"hello","rank":2,"pid":77,"step":11,"attempt":1})", 4, &err);
  REQUIRE(h);
  CHECK(h->rank == 2);
  CHECK(h->pid == 77);
  CHECK(h->attempt == 1);
  auto s = parse_report(
      R"({"type":"step","rank":0,"step":5,"loss":2.5,"start_s":100.0,"duration_s":0.2,
          "ops":[{"optype":"forward-compute","start_s":100.0,"duration_s":0.1}]})",
      4, &err);
  REQUIRE(s);
  CHECK(s->loss == 2.5);
  CHECK(s->ops.size() == 1);
  CHECK(s->ops[0].optype == "forward-compute");
  auto nan = parse_report(R"({"type":"step","rank":0,"step":5,"loss":NaN,"start_s":1,"duration_s":0.2})", 4, &err);
  REQUIRE(nan);
  CHECK_FALSE(nan->loss_finite);
  auto c = parse_report(
      R"({"type":"checkpoint","rank":0,"step":10,"path":"/x/step-00000010.safetensors","bytes":9,"seconds":0.1})", 4,
      &err);
  REQUIRE(c);
  CHECK(c->path == "/x/step-00000010.safetensors");
  auto e = parse_report(R"({"type":"error","rank":1,"step":3,"kind":"user","message":"ValueError: x"})", 4, &err);
  REQUIRE(e);
  CHECK(e->kind == "user");
  CHECK(e->message == "ValueError: x");
  CHECK(parse_report(R"({"type":"done","rank":3,"step":20})", 4, &err));
}

TEST_CASE("bad reports are refused, naming what is wrong") {
  std::string err;
  CHECK_FALSE(parse_report("not json", 4, &err));
  CHECK(err == "not a JSON object");
  CHECK_FALSE(parse_report(R"({"rank":1})", 4, &err));
  CHECK(err == "missing field 'type'");
  CHECK_FALSE(parse_report(R"({"type":"dance","rank":1})", 4, &err));
  CHECK(err == "unknown type 'dance'");
  CHECK_FALSE(parse_report(R"({"type":"done","rank":4,"step":1})", 4, &err));
  CHECK(err == "rank 4 is not in [0, 4)");
  CHECK_FALSE(parse_report(R"({"type":"step","rank":0,"step":1,"loss":1})", 4, &err));
  CHECK(err == "missing field 'start_s'");
  CHECK_FALSE(
      parse_report(R"({"type":"step","rank":0,"step":1,"start_s":1,"duration_s":1,"ops":[{"optype":3}]})", 4, &err));
  CHECK(err.find("ops") != std::string::npos);
  CHECK_FALSE(parse_report(std::string(70000, ' '), 4, &err));
  CHECK(err == "report larger than 64 KiB");
}

TEST_CASE("datagrams reach the socket; commands are whole appended lines") {
  const std::string dir = scratch("channel");
  ReportSocket sock;
  std::string err;
  REQUIRE_MESSAGE(sock.open(dir + "/job.sock", &err), err);
  const int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strcpy(sa.sun_path, (dir + "/job.sock").c_str());
  for (int i = 0; i < 3; ++i) {
    const std::string msg = R"({"type":"done","rank":0,"step":)" + std::to_string(i) + "}";
    REQUIRE(sendto(fd, msg.data(), msg.size(), 0, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == ssize_t(msg.size()));
  }
  close(fd);
  auto got = sock.drain();
  REQUIRE(got.size() == 3);
  CHECK(got[2] == R"({"type":"done","rank":0,"step":2})");
  CHECK(sock.drain().empty());

  ControlFile control;
  REQUIRE(control.open(dir + "/control.jsonl", false, &err));
  REQUIRE(control.send("checkpoint_now", -1, "", &err));
  REQUIRE(control.send("slow", 2, R"({"factor": 3})", &err));
  std::ifstream in(dir + "/control.jsonl");
  std::string a, b;
  REQUIRE(std::getline(in, a));
  REQUIRE(std::getline(in, b));
  CHECK(nlohmann::json::parse(a) == nlohmann::json{{"seq", 1}, {"command", "checkpoint_now"}, {"rank", -1}});
  CHECK(nlohmann::json::parse(b) == nlohmann::json{{"seq", 2}, {"command", "slow"}, {"rank", 2}, {"factor", 3}});
  in.close();

  // Kept (an executor re-attaching to ranks that read on): the lines stay, seq goes on after them.
  ControlFile kept;
  REQUIRE(kept.open(dir + "/control.jsonl", true, &err));
  CHECK(kept.last_seq() == 2);
  REQUIRE(kept.send("skip", 0, "", &err));
  std::ifstream again(dir + "/control.jsonl");
  std::vector<std::string> lines;
  for (std::string l; std::getline(again, l);) lines.push_back(l);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == a);
  CHECK(nlohmann::json::parse(lines[2]) == nlohmann::json{{"seq", 3}, {"command", "skip"}, {"rank", 0}});
  again.close();
  // Made anew (a new attempt's ranks read from the start): empty.
  ControlFile fresh;
  REQUIRE(fresh.open(dir + "/control.jsonl", false, &err));
  CHECK(fresh.last_seq() == 0);
  CHECK(std::filesystem::file_size(dir + "/control.jsonl") == 0);
}

TEST_CASE("the newest checkpoint at or before a step") {
  const std::string dir = scratch("checkpoints");
  for (int s : {5, 10, 15})
    std::ofstream(dir + "/step-" + std::string(8 - std::to_string(s).size(), '0') + std::to_string(s) + ".safetensors")
        << "x";
  std::ofstream(dir + "/step-00000020.safetensors.tmp") << "half";  // not complete: no final name
  std::ofstream(dir + "/notes.txt") << "x";
  CHECK(find_checkpoint(dir, -1).step == 15);
  CHECK(find_checkpoint(dir, 14).step == 10);
  CHECK(find_checkpoint(dir, 10).step == 10);
  CHECK(find_checkpoint(dir, 4).path.empty());
  CHECK(find_checkpoint(dir + "/missing", -1).step == 0);
}
