// Plugins that crash, hang, exit or lie in their descriptor: listing them
// and discovering commands runs them in child processes only, names the
// plugin that failed, and leaves every other plugin's command working; a
// plugin that crashes the running host is named in the crash report.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;

namespace {

const std::string kExe = BALLAST_EXE;
const std::string kDir = HOSTILE_PLUGIN_DIR;

// Runs `command` with stderr merged; the exit code, 128+N for a signal.
int sh(const std::string& command, std::string* out) {
  FILE* p = popen(("exec 2>&1; " + command).c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  out->clear();
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out->append(buf.data(), n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

std::string with_path(const std::string& variant) {
  return "BALLAST_PLUGIN_PROBE_MS=3000 BALLAST_PLUGIN_PATH=" + kDir + "/" + variant + " ";
}

}  // namespace

TEST_CASE("a plugin that crashes, hangs or exits in create() is named and the other commands still run") {
  for (const char* variant : {"create_null", "create_hang", "create_exit", "huge_table", "bad_string"}) {
    CAPTURE(variant);
    std::string out;
    // --help lists the other plugins' commands and names the broken file.
    CHECK(sh(with_path(variant) + kExe + " --help", &out) == 0);
    CHECK_MESSAGE(contains(out, "whatif"), out);
    CHECK_MESSAGE(contains(out, kDir + "/" + variant + "/" + variant + ".so"), out);
    // Another plugin's command runs.
    CHECK(sh(with_path(variant) + kExe + " whatif --help", &out) == 0);
    CHECK_MESSAGE(contains(out, "--trace"), out);
    // Listing the file reports it refused, with why, and exits 1.
    CHECK(sh(with_path(variant) + kExe + " plugins " + kDir + "/" + variant + "/" + variant + ".so", &out) ==
          (std::string(variant) == "bad_string" ? 1 : 0));
  }
  std::string out;
  sh(with_path("create_null") + kExe + " --help", &out);
  CHECK_MESSAGE(contains(out, "crashed with signal 11"), out);
  sh(with_path("create_hang") + kExe + " --help", &out);
  CHECK_MESSAGE(contains(out, "did not finish loading within 3000 ms"), out);
  sh(with_path("create_exit") + kExe + " --help", &out);
  CHECK_MESSAGE(contains(out, "ended the process"), out);
  sh(with_path("huge_table") + kExe + " --help", &out);
  CHECK_MESSAGE(contains(out, "claims 4294967295 command(s)"), out);
}

TEST_CASE("listing a plugin does not run its constructors in the ballast process") {
  const fs::path mark = fs::temp_directory_path() / ("hostile-mark-" + std::to_string(getpid()));
  fs::remove(mark);
  std::string out;
  // The constructor ran (in the inspecting child), never in the process
  // that was asked to list: its pid is not among those recorded.
  const std::string env = "HOSTILE_MARK=" + mark.string() + " ";
  REQUIRE(sh(env + "sh -c 'echo self=$$; exec " + kExe + " plugins " + kDir + "/constructor/constructor.so'", &out) ==
          0);
  const std::string self = out.substr(out.find("self=") + 5, out.find('\n') - out.find("self=") - 5);
  std::ifstream in(mark);
  std::string pids((std::istreambuf_iterator<char>(in)), {});
  CHECK_MESSAGE(!pids.empty(), "the constructor never ran: the test proves nothing");
  CAPTURE(self);
  CAPTURE(pids);
  CHECK(!contains(pids, self + "\n"));
  fs::remove(mark);
}

TEST_CASE("a plugin that crashes the running host is named in the crash report") {
  const fs::path config = fs::temp_directory_path() / ("hostile-run-" + std::to_string(getpid()) + ".lua");
  std::ofstream(config) << "return { plugins = { { path = \"" << kDir << "/create_null/create_null.so\" } } }\n";
  std::string out;
  CHECK(sh(kExe + " run " + config.string(), &out) == 128 + 11);
  CHECK_MESSAGE(contains(out, "crashed with SIGSEGV in plugin " + kDir + "/create_null/create_null.so"), out);
  fs::remove(config);
}
