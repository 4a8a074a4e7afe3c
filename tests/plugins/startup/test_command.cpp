#include <doctest/doctest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include <ballast/command.h>
#include <ballast/startup.h>
#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "startup_command.hpp"

using startup_test::read_text;
using startup_test::TempDir;
using startup_test::write_text;
namespace fs = std::filesystem;

namespace {

struct Output {
  int rc = -1;
  std::string out, err;
};

// Runs `ballast startup ARGS...` through the impl library in a child whose
// stdout and stderr go to files.
Output run(const TempDir& d, std::vector<std::string> args) {
  args.insert(args.begin(), "ballast startup");
  std::string out = d / ".out", err = d / ".err";
  std::fflush(stdout);  // or the child writes the parent's buffered output too
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int rc = ballast::startup::run_command(nullptr, int(args.size()), argv.data());
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(rc);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128, read_text(out), read_text(err)};
}

std::string le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(char(v >> (8 * i)));
  return s;
}

void write_model(const std::string& path) {
  std::string h =
      R"({"w":{"dtype":"F32","shape":[1024,256],"data_offsets":[0,1048576]},"b":{"dtype":"I64","shape":[3],"data_offsets":[1048576,1048600]}})";
  write_text(path, le64(h.size()) + h + startup_test::pattern(1048600, 5));
}

}  // namespace

TEST_CASE("usage errors exit 2 with a message") {
  TempDir d;
  CHECK(run(d, {}).rc == 2);
  Output u = run(d, {"frobnicate"});
  CHECK(u.rc == 2);
  CHECK(u.err.find("unknown command 'frobnicate'") != std::string::npos);
  CHECK(run(d, {"report"}).rc == 2);
  CHECK(run(d, {"env", "--lock", "x", "--dir", "y", "--store", "z"}).rc == 2);  // no install command
  Output h = run(d, {"--help"});
  CHECK(h.rc == 0);
  CHECK(h.out.find("prefetch") != std::string::npos);
  CHECK(run(d, {"load", "--help"}).out.find("--stripes") != std::string::npos);
}

TEST_CASE("env, load and time append stages that report --json adds up") {
  TempDir d;
  std::string stages = d / "stages.jsonl";
  write_text(d / "req.lock", "numpy==2.0\n");
  Output e1 =
      run(d, {"env", "--lock", d / "req.lock", "--dir", d / "env", "--store", d / "store", "--stages", stages, "--json",
              "--", "sh", "-c", "mkdir -p \"$BALLAST_ENV_DIR\" && echo 1 > \"$BALLAST_ENV_DIR/m.py\""});
  REQUIRE(e1.rc == 0);
  CHECK(nlohmann::json::parse(e1.out)["action"] == "installed+snapshot");
  fs::remove_all(d / "env");
  Output e2 = run(d, {"env", "--lock", d / "req.lock", "--dir", d / "env", "--store", d / "store", "--stages", stages,
                      "--json", "--", "false"});
  REQUIRE(e2.rc == 0);
  CHECK(nlohmann::json::parse(e2.out)["action"] == "restored");
  CHECK(read_text(d / "env/m.py") == "1\n");

  write_model(d / "m.safetensors");
  Output l1 = run(d, {"load", d / "m.safetensors", "--stripes", "4", "--chunk-mib", "1", "--write-sums", "--json",
                      "--stages", stages});
  REQUIRE(l1.rc == 0);
  auto j1 = nlohmann::json::parse(l1.out);
  CHECK(j1["tensors"] == 2);
  CHECK(j1["verified"] == false);
  CHECK(fs::exists(d / "m.safetensors.crc32c"));
  Output l2 = run(d, {"load", d / "m.safetensors", "--json", "--stages", stages});
  REQUIRE(l2.rc == 0);
  auto j2 = nlohmann::json::parse(l2.out);
  CHECK(j2["verified"] == true);
  CHECK(j2["checksum"] == j1["checksum"]);

  CHECK(run(d, {"time", "comm_init", "--stages", stages, "--", "sh", "-c", "exit 0"}).rc == 0);
  CHECK(run(d, {"time", "first_step", "--stages", stages, "--", "sh", "-c", "exit 6"}).rc == 6);

  Output r = run(d, {"report", "--json", stages});
  REQUIRE(r.rc == 0);
  auto rep = nlohmann::json::parse(r.out);
  CHECK(rep["records"] == 6);
  std::vector<std::string> names;
  for (auto& s : rep["stages"]) names.push_back(s["stage"]);
  CHECK(names == std::vector<std::string>{"environment", "checkpoint_load", "comm_init", "first_step"});
  CHECK(rep["stages"][1]["bytes"].get<uint64_t>() == 2 * fs::file_size(d / "m.safetensors"));
  CHECK(rep["stages"][3]["failed"] == 1);
  Output text = run(d, {"report", stages});
  CHECK(text.out.find("checkpoint_load") != std::string::npos);
}

TEST_CASE("load of a truncated safetensors file fails with the file named and exit 1") {
  TempDir d;
  write_text(d / "t.safetensors", le64(4096) + "{\"a\":");
  Output o = run(d, {"load", d / "t.safetensors"});
  CHECK(o.rc == 1);
  CHECK(o.err.find(d / "t.safetensors" + ": truncated safetensors header (says 4096 bytes") != std::string::npos);
}

TEST_CASE("the plugin offers the startup command and the ballast.startup interface") {
  TempDir d;
  void* so = ::dlopen(BALLAST_PLUGIN_DIR "/ballast-startup.so", RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(so != nullptr, ::dlerror());
  auto entry = reinterpret_cast<ballast_plugin_entry_fn>(::dlsym(so, BALLAST_PLUGIN_ENTRY));
  REQUIRE(reinterpret_cast<void*>(entry) != nullptr);
  const ballast_plugin_descriptor* desc = entry(BALLAST_ABI_MINOR);
  REQUIRE(desc != nullptr);
  CHECK(std::string(desc->name) == "startup");
  bool has_cmd = false, has_api = false;
  for (const ballast_interface_info* i = desc->interfaces; i->name != nullptr; ++i) {
    has_cmd |= std::string(i->name) == BALLAST_COMMAND_INTERFACE;
    has_api |= std::string(i->name) == BALLAST_STARTUP_INTERFACE;
  }
  CHECK(has_cmd);
  CHECK(has_api);
  void* state = nullptr;
  REQUIRE(desc->create(nullptr, &state) == BALLAST_OK);
  auto* table = static_cast<const ballast_command_table*>(desc->get_interface(state, BALLAST_COMMAND_INTERFACE, 1));
  REQUIRE(table != nullptr);
  REQUIRE(table->count == 1);
  CHECK(std::string(table->commands[0].name) == "startup");
  CHECK(desc->get_interface(state, BALLAST_STARTUP_INTERFACE, 2) == nullptr);

  auto* api = static_cast<const ballast_startup_api*>(desc->get_interface(state, BALLAST_STARTUP_INTERFACE, 1));
  REQUIRE(api != nullptr);
  REQUIRE(api->size == sizeof(ballast_startup_api));
  write_model(d / "m.safetensors");
  ballast_startup_load_options o{};
  o.size = sizeof o;
  o.stripes = 3;
  o.chunk_bytes = 1 << 20;
  ballast_startup_file* f = nullptr;
  REQUIRE(api->load(state, (d / "m.safetensors").c_str(), &o, &f) == BALLAST_OK);
  uint64_t n = 0;
  const auto* bytes = static_cast<const unsigned char*>(api->data(f, &n));
  CHECK(n == fs::file_size(d / "m.safetensors"));
  CHECK(std::memcmp(bytes, read_text(d / "m.safetensors").data(), n) == 0);
  REQUIRE(api->tensor_count(f) == 2);
  ballast_startup_tensor t{};
  bool found = false;
  for (uint32_t i = 0; i < 2; ++i) {
    REQUIRE(api->tensor(f, i, &t) == BALLAST_OK);
    if (std::string(t.name) != "b") continue;
    found = true;
    CHECK(std::string(t.dtype) == "I64");
    CHECK(t.ndim == 1);
    CHECK(t.shape[0] == 3);
    CHECK(t.bytes == 24);
    CHECK(t.offset + t.bytes == n);
  }
  CHECK(found);
  CHECK(api->tensor(f, 2, &t) == BALLAST_EINVAL);
  CHECK(api->checksum(f) != 0);
  api->release(state, f);

  write_text(d / "bad.safetensors", "abc");
  CHECK(api->load(state, (d / "bad.safetensors").c_str(), nullptr, &f) == BALLAST_EIO);
  CHECK(std::string(api->last_error(state)).find("truncated safetensors header") != std::string::npos);

  ::setenv("BALLAST_STARTUP_STAGES", (d / "s.jsonl").c_str(), 1);
  CHECK(api->stage(state, "comm_init", 100, 200, 0, 0) == BALLAST_OK);
  CHECK(api->stage(state, "first_step", 300, 200, 0, 0) == BALLAST_EINVAL);
  ::unsetenv("BALLAST_STARTUP_STAGES");
  CHECK(read_text(d / "s.jsonl").find("\"stage\":\"comm_init\"") != std::string::npos);
  desc->destroy(state);
}
