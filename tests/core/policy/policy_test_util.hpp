// Shared by the policy tests: a sink that records everything, scripts in a
// temporary folder, and events.
#pragma once

#include "error.hpp"
#include "policy.hpp"

#include <ballast/events.h>
#include <ballast/status.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ballast_test {

struct Recorder : ballast::PolicySink {
  std::vector<ballast::PolicyAction> actions;
  std::vector<std::pair<std::string, std::string>> published;
  std::vector<std::pair<int, std::string>> logs;
  std::vector<std::string> errors;

  void on_action(const ballast::PolicyAction& a) override { actions.push_back(a); }
  // ballast.publish's event, recorded as its topic and its payload as JSON text.
  void on_publish(ballast::OwnedEvent event) override {
    const ballast_event& e = event.view();
    published.emplace_back(e.topic, ballast::event_to_json(e)["payload"].dump());
  }
  void on_log(int level, const std::string& message) override { logs.emplace_back(level, message); }
  void on_error(const std::string& message) override { errors.push_back(message); }
  void clear() {
    actions.clear();
    published.clear();
    logs.clear();
    errors.clear();
  }
};

// A folder removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ballast-policy-XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    REQUIRE(p != nullptr);
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    std::string file = (path_ / name).string();
    std::ofstream out(file, std::ios::binary);
    out << text;
    return file;
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline ballast_event make_event(const char* topic, uint32_t schema = BALLAST_SCHEMA_NONE, const void* payload = nullptr,
                                uint64_t size = 0) {
  ballast_event e{};
  e.size = sizeof(ballast_event);
  e.schema = schema;
  e.topic = topic;
  e.ts_ns = 1700000000123456789;
  e.source.node = "gpu001";
  e.source.rank = 3;
  e.source.plugin = "test";
  e.payload = payload;
  e.payload_size = size;
  return e;
}

inline ballast_event json_event(const char* topic, const std::string& text) {
  return make_event(topic, BALLAST_SCHEMA_JSON, text.data(), text.size());
}

// Load `script` (written to a file) or fail the test with the message.
inline std::unique_ptr<ballast::Policy> load_script(const TempDir& dir, const std::string& script,
                                                    ballast::PolicyOptions options = {},
                                                    const std::string& name = "test.lua") {
  std::unique_ptr<ballast::Policy> p;
  int rc = ballast::Policy::load(dir.write(name, script), std::move(options), &p);
  INFO(ballast::last_error());
  REQUIRE(rc == BALLAST_OK);
  return p;
}

}  // namespace ballast_test
