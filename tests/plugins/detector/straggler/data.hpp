// Paths of the straggler test data and a scratch folder for the tests.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace straggler_test {

inline std::string data(const std::string& trace, const std::string& file) {
  return std::string(BALLAST_SOURCE_DIR) + "/tests/data/stragglers/" + trace + "/" + file;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh folder, removed with its contents at the end of the test.
struct Scratch {
  std::filesystem::path dir;
  explicit Scratch(const std::string& name)
      : dir(std::filesystem::temp_directory_path() / ("ballast-straggler-" + name + "-" + std::to_string(getpid()))) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~Scratch() { std::filesystem::remove_all(dir); }
  std::string write(const std::string& name, const std::string& content) const {
    std::string path = (dir / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
};

}  // namespace straggler_test
