// ABI negotiation and plugin loading: each defective plugin is refused with a
// message naming the file and the reason, and nothing crashes.
#include "error.hpp"
#include "plugin_loader.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using namespace ballast;

namespace {

std::string plugin(const std::string& name) { return std::string(LOADER_PLUGIN_DIR) + "/" + name + ".so"; }

// Load `name` expecting a refusal; returns the message.
std::string refusal(const std::string& path, int expected_status) {
  PluginFile f;
  int rc = load_plugin_file(path, &f);
  CHECK(rc == expected_status);
  std::string message = last_error();
  CHECK(message.find(fs::path(path).filename().string()) != std::string::npos);  // names the file
  return message;
}

std::string scratch_copy(const std::string& from, const std::string& to_name, size_t keep_bytes) {
  fs::path dir = fs::temp_directory_path() / ("ballast-loader-" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::path to = dir / to_name;
  std::ifstream in(from, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (keep_bytes < bytes.size()) bytes.resize(keep_bytes);
  std::ofstream(to, std::ios::binary) << bytes;
  return to.string();
}

}  // namespace

TEST_CASE("a valid plugin is loaded with its descriptor and interfaces") {
  PluginFile f;
  REQUIRE(load_plugin_file(plugin("good"), &f) == BALLAST_OK);
  CHECK(f.name == "good");
  CHECK(f.kind == "test");
  CHECK(f.abi_major == 1);
  CHECK((f.get_interface != nullptr));
  CHECK(f.offers("test.echo", 1));
  CHECK_FALSE(f.offers("test.echo", 2));
}

TEST_CASE("loading the same file twice gives the same descriptor (plugins stay resident)") {
  PluginFile a, b;
  REQUIRE(load_plugin_file(plugin("good"), &a) == BALLAST_OK);
  REQUIRE(load_plugin_file(plugin("good"), &b) == BALLAST_OK);
  CHECK(a.descriptor == b.descriptor);
}

TEST_CASE("an older minor layout is accepted and its missing optional fields read as absent") {
  PluginFile f;
  REQUIRE(load_plugin_file(plugin("old_minor"), &f) == BALLAST_OK);
  CHECK(f.name == "oldminor");
  CHECK(f.descriptor_size == BALLAST_PLUGIN_DESCRIPTOR_V1_SIZE);
  CHECK((f.get_interface == nullptr));
  CHECK(f.interfaces.empty());
}

TEST_CASE("a newer minor with a grown descriptor is accepted") {
  PluginFile f;
  REQUIRE(load_plugin_file(plugin("new_minor"), &f) == BALLAST_OK);
  CHECK(f.abi_minor == 99);
  CHECK(f.descriptor_size > sizeof(ballast_plugin_descriptor));
  CHECK(f.offers("test.echo", 1));
}

TEST_CASE("a newer major is refused") {
  std::string m = refusal(plugin("new_major"), BALLAST_EVERSION);
  CHECK(m.find("abi_major is 2") != std::string::npos);
}

TEST_CASE("a descriptor shorter than the required prefix is refused") {
  std::string m = refusal(plugin("short"), BALLAST_EFORMAT);
  CHECK(m.find("size 16") != std::string::npos);
}

TEST_CASE("a descriptor without a name is refused") {
  std::string m = refusal(plugin("no_name"), BALLAST_EFORMAT);
  CHECK(m.find("name") != std::string::npos);
}

TEST_CASE("a plugin that declines the host's ABI minor is refused") {
  std::string m = refusal(plugin("decline"), BALLAST_EVERSION);
  CHECK(m.find("newer host") != std::string::npos);
}

TEST_CASE("a shared object without ballast_plugin_v1 is refused") {
  std::string m = refusal(plugin("no_symbol"), BALLAST_ENOTFOUND);
  CHECK(m.find("ballast_plugin_v1") != std::string::npos);
}

TEST_CASE("an entry symbol defined by a dependency, not the plugin itself, is refused") {
  std::string m = refusal(plugin("foreign"), BALLAST_EFORMAT);
  CHECK(m.find("not in the plugin file itself") != std::string::npos);
}

TEST_CASE("a missing file is refused") {
  PluginFile f;
  CHECK(load_plugin_file("/nonexistent/ballast-nothing.so", &f) == BALLAST_ENOTFOUND);
  CHECK(std::string(last_error()).find("/nonexistent/ballast-nothing.so") != std::string::npos);
}

TEST_CASE("garbage and truncated shared objects are refused without crashing") {
  SUBCASE("garbage") {
    std::string path = scratch_copy("/proc/self/cmdline", "garbage.so", 1 << 20);
    { std::ofstream(path, std::ios::binary) << std::string(4096, '\x5a'); }
    std::string m = refusal(path, BALLAST_EFORMAT);
    CHECK(m.find("not an ELF file") != std::string::npos);
  }
  SUBCASE("empty") {
    std::string path = scratch_copy(plugin("good"), "empty.so", 0);
    refusal(path, BALLAST_EFORMAT);
  }
  SUBCASE("truncated at several points") {
    size_t size = fs::file_size(plugin("good"));
    for (size_t keep : {size_t{10}, size_t{64}, size_t{200}, size / 4, size / 2, size - 100}) {
      CAPTURE(keep);
      std::string path = scratch_copy(plugin("good"), "truncated-" + std::to_string(keep) + ".so", keep);
      PluginFile f;
      CHECK(load_plugin_file(path, &f) != BALLAST_OK);
      CHECK_FALSE(std::string(last_error()).empty());
    }
  }
}

TEST_CASE("the ELF check accepts real plugins and names the defect of bad ones") {
  std::string reason;
  CHECK(check_elf_file(plugin("good"), &reason) == BALLAST_OK);
  CHECK(check_elf_file(std::string(BALLAST_PLUGIN_DIR) + "/ballast-hello.so", &reason) == BALLAST_OK);
  size_t size = fs::file_size(plugin("good"));
  std::string cut = scratch_copy(plugin("good"), "cut.so", size / 2);
  CHECK(check_elf_file(cut, &reason) == BALLAST_EFORMAT);
  CHECK(reason.find("truncated") != std::string::npos);
}

TEST_CASE("plugin references resolve by path and by name through BALLAST_PLUGIN_PATH") {
  setenv("BALLAST_PLUGIN_PATH", LOADER_PLUGIN_DIR, 1);
  std::string path;
  CHECK(resolve_plugin("good", "/", &path) == BALLAST_OK);
  CHECK(fs::path(path).filename() == "good.so");
  CHECK(resolve_plugin(plugin("good"), "/", &path) == BALLAST_OK);
  CHECK(resolve_plugin("nonesuch", "/", &path) == BALLAST_ENOTFOUND);
  CHECK(std::string(last_error()).find(LOADER_PLUGIN_DIR) != std::string::npos);
  unsetenv("BALLAST_PLUGIN_PATH");
}
