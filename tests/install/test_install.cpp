// The installed package is enough to build a plugin out of tree: headers,
// the CMake package and the pkg-config file; the installed `ballast` lists
// the plugin so built.
#include <doctest/doctest.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace fs = std::filesystem;

namespace {

// Run a shell command; returns its exit status and its output in *out.
int sh(const std::string& command, std::string* out = nullptr) {
  std::string full = command + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  std::string text;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
  int status = pclose(p);
  if (out) *out = text;
  if (status != 0) MESSAGE(command << "\n" << text);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("a plugin builds out of tree against the installed package and the installed host loads it") {
  fs::path scratch = fs::temp_directory_path() / ("ballast-install-" + std::to_string(getpid()));
  fs::remove_all(scratch);
  fs::path prefix = scratch / "prefix";
  std::string cmake = CMAKE_COMMAND_PATH;

  REQUIRE(sh(cmake + " --install " + BALLAST_BINARY_DIR + " --prefix " + prefix.string()) == 0);
  CHECK(fs::exists(prefix / "include/ballast/plugin.h"));
  CHECK(fs::exists(prefix / "bin/ballast"));
  CHECK(fs::exists(prefix / "lib/cmake/Ballast/BallastConfig.cmake"));
  CHECK(fs::exists(prefix / "lib/pkgconfig/ballast.pc"));
  CHECK(fs::exists(prefix / "lib/ballast/plugins/ballast-hello.so"));

  SUBCASE("with find_package(Ballast)") {
    fs::path build = scratch / "hello-cmake";
    REQUIRE(sh(cmake + " -S " + BALLAST_SOURCE_DIR + "/examples/hello-plugin -B " + build.string() +
               " -DCMAKE_PREFIX_PATH=" + prefix.string() + " -DCMAKE_C_COMPILER=" + BALLAST_C_COMPILER) == 0);
    REQUIRE(sh(cmake + " --build " + build.string()) == 0);
    fs::path so = build / "ballast-hello.so";
    REQUIRE(fs::exists(so));
    std::string out;
    REQUIRE(sh(prefix.string() + "/bin/ballast plugins --json " + so.string(), &out) == 0);
    CHECK(out.find("\"name\":\"hello\"") != std::string::npos);
  }

  SUBCASE("with pkg-config and a plain compiler call") {
    fs::path so = scratch / "hello-pc.so";
    std::string env = "PKG_CONFIG_PATH=" + (prefix / "lib/pkgconfig").string() + " ";
    std::string cflags;
    REQUIRE(sh(env + "pkg-config --cflags ballast", &cflags) == 0);
    while (!cflags.empty() && (cflags.back() == '\n' || cflags.back() == ' ')) cflags.pop_back();
    CHECK(cflags.find("include") != std::string::npos);
    REQUIRE(sh(std::string(BALLAST_C_COMPILER) + " -std=c99 -Wall -Wextra -pedantic -Werror -shared -fPIC " +
               "-fvisibility=hidden -Wl,-z,defs " + cflags + " " + BALLAST_SOURCE_DIR +
               "/examples/hello-plugin/hello.c -o " + so.string()) == 0);
    std::string out;
    REQUIRE(sh(prefix.string() + "/bin/ballast plugins " + so.string(), &out) == 0);
    CHECK(out.find("hello") != std::string::npos);
  }
  fs::remove_all(scratch);
}
