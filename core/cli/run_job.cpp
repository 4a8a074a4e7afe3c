#include "run_job.hpp"

#include <filesystem>

namespace ballast::cli {

namespace {

bool is_runner(const nlohmann::json& entry) {
  const nlohmann::json* path =
      entry.is_string() ? &entry : (entry.is_object() && entry.contains("path") ? &entry["path"] : nullptr);
  if (!path || !path->is_string()) return false;
  const std::string stem = std::filesystem::path(path->get<std::string>()).stem().string();
  return stem == "runner" || stem == "ballast-runner";
}

}  // namespace

bool hand_job_to_runner(nlohmann::json& config, const std::string& base_dir, const JobFlags& flags, bool* has_job,
                        std::string* error) {
  const bool flagged = !flags.inject.empty() || !flags.inject_schedule.empty() || !flags.timeline.empty();
  nlohmann::json* plugins = config.contains("plugins") && config["plugins"].is_array() ? &config["plugins"] : nullptr;
  nlohmann::json* entry = nullptr;
  if (plugins)
    for (auto& e : *plugins)
      if (is_runner(e)) entry = &e;
  // The runner with a `relay` table (a node's agent) relays reports and runs no job.
  const bool relay = entry && entry->is_object() && entry->contains("config") && (*entry)["config"].is_object() &&
                     (*entry)["config"].contains("relay");
  *has_job = config.contains("job") || (entry != nullptr && !relay);
  if (!*has_job) {
    if (flagged)
      *error =
          "--inject, --inject-schedule and --timeline need a config with a job (job = { command = {...}, ranks = N })";
    return !flagged;
  }
  if (!entry) {
    if (!plugins) config["plugins"] = nlohmann::json::array();
    plugins = &config["plugins"];
    // First: the hang detector, created after it, finds the job's traces.
    plugins->insert(plugins->begin(), nlohmann::json{{"path", "runner"}});
    entry = &(*plugins)[0];
  }
  if (entry->is_string()) *entry = nlohmann::json{{"path", *entry}};
  nlohmann::json& pc = (*entry)["config"];
  if (!pc.is_object()) pc = nlohmann::json::object();
  if (config.contains("job") && !pc.contains("job")) pc["job"] = config["job"];
  pc["base_dir"] = base_dir;
  // Paths on the command line are relative to where ballast runs.
  auto abs = [](const std::string& p) { return std::filesystem::absolute(p).lexically_normal().string(); };
  if (!flags.inject.empty()) {
    if (!pc.contains("inject") || !pc["inject"].is_array()) pc["inject"] = nlohmann::json::array();
    for (const auto& s : flags.inject) pc["inject"].push_back(s);
  }
  if (!flags.inject_schedule.empty()) pc["inject_schedule"] = abs(flags.inject_schedule);
  if (!flags.timeline.empty()) pc["timeline"] = abs(flags.timeline);
  if (flags.json) pc["report"] = "json";
  return true;
}

int JobWatch::attach(Host& host) {
  host_ = &host;
  uint64_t id = 0;
  if (int rc = host.subscribe("job.state", nullptr, on_event, this, "host", &id); rc != BALLAST_OK) return rc;
  return host.subscribe("job.report", nullptr, on_event, this, "host", &id);
}

int JobWatch::on_event(void* user, const ballast_event* ev) {
  auto* w = static_cast<JobWatch*>(user);
  if (ev->schema != BALLAST_SCHEMA_JSON || !ev->payload) return 0;
  nlohmann::json j = nlohmann::json::parse(static_cast<const char*>(ev->payload),
                                           static_cast<const char*>(ev->payload) + ev->payload_size, nullptr, false);
  if (!j.is_object()) return 0;
  const std::string topic = ev->topic;
  bool terminal = false;
  {
    std::lock_guard<std::mutex> lock(w->mu_);
    if (topic == "job.report") {
      w->report_ = j;
    } else {
      w->started_ = true;
      if (j.contains("state") && j["state"].is_string()) w->state_ = j["state"];
      terminal = j.value("terminal", false);
    }
  }
  if (terminal) w->host_->request_stop();
  return 0;
}

int JobWatch::exit_code() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == "finished") return 0;
  if (state_ == "interrupted") return 130;
  return 1;
}

nlohmann::json JobWatch::report() const {
  std::lock_guard<std::mutex> lock(mu_);
  return report_;
}

}  // namespace ballast::cli
