// docs/job-channel.md from the trainer's side: reports on the executor's
// datagram socket, commands from the control file at step boundaries, and
// the faults BALLAST_INJECT asks for; plus the errors bad input gets.
#include <doctest/doctest.h>

#include "trainer_run.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The executor's end: a bound datagram socket.
class Inbox {
 public:
  explicit Inbox(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    timeval tv{0, 100000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~Inbox() { close(fd_); }
  // Receives what arrives within 0.1 s; appends to all().
  void pump() {
    char buf[65536];
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    while (std::chrono::steady_clock::now() < end) {
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return;
      reports_.push_back(json::parse(std::string(buf, size_t(n))));
    }
  }
  // Pumps until pred(all()) or timeout_s.
  template <class P>
  bool until(P pred, double timeout_s = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!pred(reports_)) {
      if (std::chrono::steady_clock::now() > end) return false;
      pump();
    }
    return true;
  }
  const std::vector<json>& all() const { return reports_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<json> reports_;
};

int count(const std::vector<json>& rs, const std::string& type, int rank = -1) {
  return int(std::count_if(rs.begin(), rs.end(),
                           [&](const json& r) { return r["type"] == type && (rank < 0 || r["rank"] == rank); }));
}

uint64_t last_step(const std::vector<json>& rs, int rank) {
  uint64_t s = 0;
  for (const auto& r : rs)
    if (r["type"] == "step" && r["rank"] == rank) s = r["step"];
  return s;
}

void append(const std::string& file, const std::string& text) {
  std::ofstream(file, std::ios::app) << text << std::flush;
}

double median_backward(const std::vector<json>& rs, int rank, uint64_t from, uint64_t to) {
  std::vector<double> d;
  for (const auto& r : rs)
    if (r["type"] == "step" && r["rank"] == rank && r["step"] >= from && r["step"] < to)
      for (const auto& op : r["ops"])
        if (op["optype"] == "backward-compute") d.push_back(op["duration_s"]);
  if (d.empty()) return 0;
  std::sort(d.begin(), d.end());
  return d[d.size() / 2];
}

}  // namespace

TEST_CASE("supervised: hello, step reports with their operations, checkpoint_now, slow, stop at a whole line") {
  const std::string dir = test::fresh_dir("channel");
  Inbox inbox(dir + "/job.sock");
  const std::string control = dir + "/control.jsonl", ckpt = dir + "/ckpt";
  fs::create_directories(ckpt);
  std::ofstream(control).close();
  fs::create_directories(dir + "/trace");
  const auto p = test::start(
      test::launch_argv(2, dir + "/trace", {"--steps", "100000", "--checkpoint-every", "0", "--log-every", "1000"}),
      {{"BALLAST_JOB_SOCKET", inbox.path()},
       {"BALLAST_CONTROL_FILE", control},
       {"BALLAST_CHECKPOINT_DIR", ckpt},
       {"BALLAST_ATTEMPT", "3"},
       {"BALLAST_INJECT", ""},
       {"BALLAST_RESUME_FROM", ""}},
      dir, "launch");
  const double t_start = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto both_past = [&](uint64_t s) {
    return [s](const std::vector<json>& rs) { return last_step(rs, 0) >= s && last_step(rs, 1) >= s; };
  };
  REQUIRE(inbox.until(both_past(20)));
  for (int rank : {0, 1}) {
    const auto& rs = inbox.all();
    auto hello =
        std::find_if(rs.begin(), rs.end(), [&](const json& r) { return r["type"] == "hello" && r["rank"] == rank; });
    REQUIRE(hello != rs.end());
    CHECK((*hello)["step"] == 1);
    CHECK((*hello)["attempt"] == 3);
    CHECK((*hello)["pid"].get<int>() > 0);
  }
  const json& step =
      *std::find_if(inbox.all().begin(), inbox.all().end(), [](const json& r) { return r["type"] == "step"; });
  CHECK(step["loss"].get<double>() > 0);
  CHECK(std::abs(step["start_s"].get<double>() - t_start) < 60);
  std::vector<std::string> types;
  for (const auto& op : step["ops"]) types.push_back(op["optype"]);
  CHECK(types == std::vector<std::string>{"forward-compute", "backward-compute", "grads-all-reduce", "optimizer"});

  // checkpoint_now: rank 0 saves at the next boundary.
  append(control, R"({"seq":1,"command":"checkpoint_now"})"
                  "\n");
  REQUIRE(inbox.until([](const std::vector<json>& rs) { return count(rs, "checkpoint") == 1; }));
  const json ck =
      *std::find_if(inbox.all().begin(), inbox.all().end(), [](const json& r) { return r["type"] == "checkpoint"; });
  CHECK(ck["rank"] == 0);
  CHECK(ck["step"].get<uint64_t>() >= 20);
  CHECK(fs::file_size(ck["path"].get<std::string>()) == ck["bytes"].get<uint64_t>());

  // A line that is not JSON is skipped with a message; slow on rank 1 only.
  append(control, "not json\n");
  const uint64_t before = last_step(inbox.all(), 1);
  append(control, R"({"seq":2,"command":"slow","factor":6,"rank":1})"
                  "\n");
  REQUIRE(inbox.until(both_past(before + 25)));
  const double fast = median_backward(inbox.all(), 1, before - 15, before);
  const double slow = median_backward(inbox.all(), 1, before + 5, before + 25);
  CHECK(slow > 2 * fast);
  CHECK(median_backward(inbox.all(), 0, before + 5, before + 25) < slow);

  // Half a line waits for its newline; then every rank stops at one step.
  append(control, R"({"seq":3,"comm)");
  const uint64_t partial = last_step(inbox.all(), 0);
  REQUIRE(inbox.until(both_past(partial + 5)));
  CHECK(count(inbox.all(), "done") == 0);
  append(control, R"(and":"stop"})"
                  "\n");
  REQUIRE(inbox.until([](const std::vector<json>& rs) { return count(rs, "done") == 2; }));
  const auto r = test::finish(p, 60);
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK(r.err.find("control.jsonl line 2 skipped: not a JSON object") != std::string::npos);
  uint64_t done_step[2] = {0, 0};
  for (const auto& x : inbox.all())
    if (x["type"] == "done") done_step[x["rank"].get<int>()] = x["step"];
  CHECK(done_step[0] == done_step[1]);
  CHECK(done_step[0] < 100000);
  CHECK(fs::exists(ckpt + "/step-" + std::string(8 - std::to_string(done_step[0]).size(), '0') +
                   std::to_string(done_step[0]) + ".safetensors"));
}

TEST_CASE("BALLAST_INJECT: a NaN loss and a user-code error end the rank with an error report") {
  const std::string dir = test::fresh_dir("inject");
  Inbox inbox(dir + "/job.sock");
  SUBCASE("nan") {
    const auto r =
        test::trainer({"--steps", "20"}, dir, {{"BALLAST_JOB_SOCKET", inbox.path()}, {"BALLAST_INJECT", "nan@7"}});
    CHECK(r.code == 4);
    inbox.pump();
    REQUIRE(count(inbox.all(), "error") == 1);
    const json e = inbox.all().back();
    CHECK(e["kind"] == "nan");
    CHECK(e["step"] == 7);
    CHECK(last_step(inbox.all(), 0) == 6);
    CHECK(count(inbox.all(), "done") == 0);
  }
  SUBCASE("user error") {
    const auto r = test::trainer({"--steps", "20"}, dir,
                                 {{"BALLAST_JOB_SOCKET", inbox.path()}, {"BALLAST_INJECT", "usererror@3"}});
    CHECK(r.code == 3);
    inbox.pump();
    REQUIRE(count(inbox.all(), "error") == 1);
    const json e = inbox.all().back();
    CHECK(e["kind"] == "user");
    CHECK(e["step"] == 3);
    CHECK(e["message"].get<std::string>().find("user code raised an error at step 3") != std::string::npos);
  }
  SUBCASE("a bad specification") {
    const auto r = test::trainer({"--steps", "20"}, dir, {{"BALLAST_INJECT", "nan@7,boom@3"}});
    CHECK(r.code == 2);
    CHECK(r.err.find("BALLAST_INJECT: 'boom@3': unknown kind 'boom'") != std::string::npos);
  }
}

TEST_CASE("a rank told to skip leaves its collective out: every rank fails at the next step, naming it") {
  const std::string dir = test::fresh_dir("skip");
  Inbox inbox(dir + "/job.sock");
  const std::string control = dir + "/control.jsonl";
  std::ofstream(control).close();
  fs::create_directories(dir + "/trace");
  const auto p = test::start(test::launch_argv(2, dir + "/trace", {"--steps", "100000"}),
                             {{"BALLAST_CONTROL_FILE", control},
                              {"BALLAST_JOB_SOCKET", inbox.path()},
                              {"BALLAST_COMM_TIMEOUT_MS", "20000"},
                              {"BALLAST_INJECT", ""}},
                             dir, "launch");
  REQUIRE(inbox.until([](const std::vector<json>& rs) { return last_step(rs, 1) >= 5; }));
  append(control, R"({"seq":1,"command":"skip","rank":1})"
                  "\n");
  // Read while the ranks fail: an error report waits (up to 1 s) for room in this socket's queue
  // of 10, which their step reports fill.
  const bool reported = inbox.until([](const std::vector<json>& rs) { return count(rs, "error") >= 1; });
  const auto r = test::finish(p, 120);
  INFO(r.out << r.err);
  CHECK(r.code == 1);
  CHECK(r.err.find("rank 1: leaving the all-reduce of step") != std::string::npos);
  inbox.pump();
  // Both ranks see it; the launcher may stop the second before it reports.
  REQUIRE(reported);
  for (const auto& e : inbox.all())
    if (e["type"] == "error") {
      CHECK(e["kind"] == "internal");
      CHECK(e["message"].get<std::string>().find("joined ranks out of step: rank 1 at step") != std::string::npos);
    }
  CHECK(count(inbox.all(), "done") == 0);
}

TEST_CASE("commands written before a rank started were for an earlier attempt: not obeyed") {
  const std::string dir = test::fresh_dir("old");
  const std::string control = dir + "/control.jsonl";
  append(control, R"({"seq":1,"command":"stop"})"
                  "\n"
                  R"({"seq":2,"command":"skip"})"
                  "\n");
  const auto r = test::trainer({"--steps", "15", "--log-every", "5"}, dir, {{"BALLAST_CONTROL_FILE", control}});
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find("done: step 15") != std::string::npos);
}

TEST_CASE("bad input: a missing or too short data file, an unknown option") {
  const std::string dir = test::fresh_dir("input");
  SUBCASE("missing data") {
    const auto r = test::trainer({"--data", dir + "/no-such-file"}, dir);
    CHECK(r.code == 2);
    CHECK(r.err.find("data: " + dir + "/no-such-file: No such file or directory") != std::string::npos);
  }
  SUBCASE("too short") {
    std::ofstream(dir + "/short.txt") << "abc";
    const auto r = test::trainer({"--data", dir + "/short.txt"}, dir);
    CHECK(r.code == 2);
    CHECK(r.err.find("short.txt: 3 bytes, fewer than the 17 one training window needs") != std::string::npos);
  }
  SUBCASE("unknown option") {
    const auto r = test::trainer({"--stpes", "10"}, dir);
    CHECK(r.code != 0);
    CHECK(r.err.find("--stpes") != std::string::npos);
  }
}
