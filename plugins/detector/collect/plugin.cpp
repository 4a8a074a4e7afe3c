// ballast-collect: the node collector. Every `period` it samples the node
// (/proc, /sys), the job's processes and cgroups, the GPUs (NVML, when
// present) and Prometheus endpoints, and publishes one metric.sample batch.
#include "node_sampler.hpp"
#include "nvml.hpp"
#include "prometheus.hpp"

#include <ballast/ballast.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace {

using namespace ballast::collect;

struct State {
  const ballast_host_api* host;
  std::string node;
  double period_s = 1.0;
  bool gpu = true;
  std::string nvml_library = "libnvidia-ml.so.1";
  std::unique_ptr<NodeSampler> sampler;
  std::unique_ptr<Nvml> nvml;
  Rates gpu_rates;
  std::vector<std::unique_ptr<Scraper>> scrapers;
  std::vector<std::string> scrape_errors;  // last error per scraper, logged on change
  uint64_t timer = 0;
  bool timing = false;
  std::mutex mu;  // the timer thread vs stop()
};

// The host's node name (the config's `node`), as every other event of the
// host carries it; a 1.0 host's table has no node_name: the machine's name.
std::string host_node(const ballast_host_api* host) {
  if (BALLAST_COVERS(host->size, ballast_host_api, node_name)) return host->node_name(host);
  char hostname[256] = {};
  gethostname(hostname, sizeof hostname - 1);
  return hostname;
}

// A config value that may be a list (JSON array text) or one plain value.
std::vector<std::string> list_of(const std::string& text) {
  std::vector<std::string> out;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_array()) {
    for (const auto& e : j) out.push_back(e.is_string() ? e.get<std::string>() : e.dump());
  } else {
    size_t b = 0;
    for (;;) {  // "a,b,c"
      size_t e = text.find(',', b);
      std::string item = text.substr(b, e == std::string::npos ? std::string::npos : e - b);
      if (!item.empty()) out.push_back(item);
      if (e == std::string::npos) break;
      b = e + 1;
    }
  }
  return out;
}

// A secret from KEY (in the config) or KEY_file (a file holding it, one
// trailing newline dropped): a file keeps it out of the config. False with
// *why when both are given or the file cannot be read.
template <class Get>
bool secret(const Get& get, const std::string& key, std::string* out, std::string* why) {
  std::string v, file;
  const bool inline_value = get(key.c_str(), &v);
  if (!get((key + "_file").c_str(), &file)) {
    if (inline_value) *out = v;
    return true;
  }
  if (inline_value) {
    *why = "config keys '" + key + "' and '" + key + "_file': give one";
    return false;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    *why = "config key '" + key + "_file': cannot open " + file + ": " + std::strerror(errno);
    return false;
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    *why = "config key '" + key + "_file': cannot read " + file;
    return false;
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  *out = text;
  return true;
}

void tick(void* user) {
  auto* s = static_cast<State*>(user);
  std::lock_guard<std::mutex> lock(s->mu);
  int64_t ts = s->host->now_ns(s->host);
  std::vector<Sample> samples;
  s->sampler->sample(ts, &samples);
  if (s->nvml) {
    s->nvml->sample(ts, &s->gpu_rates, &samples);
    s->gpu_rates.sweep();
  }
  for (size_t i = 0; i < s->scrapers.size(); ++i) {
    std::string error;
    bool ok = s->scrapers[i]->scrape(ts, &samples, &error);
    if (!ok && error != s->scrape_errors[i]) s->host->log(s->host, BALLAST_LOG_WARN, error.c_str());
    s->scrape_errors[i] = ok ? "" : error;
  }
  std::vector<ballast_metric_sample> out(samples.size());
  int64_t invalid = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    out[i] = {s->node.c_str(), samples[i].metric.c_str(), ts, samples[i].value, samples[i].flags};
    if (samples[i].flags & (BALLAST_SAMPLE_INVALID | BALLAST_SAMPLE_COUNTER_RESET)) ++invalid;
  }
  ballast_metric_batch batch{sizeof batch, static_cast<uint32_t>(out.size()), out.data()};
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
  ev.topic = "metric.sample";
  ev.ts_ns = ts;
  ev.source = {s->node.c_str(), -1, nullptr};
  ev.payload = &batch;
  ev.payload_size = sizeof batch;
  s->host->publish(s->host, &ev);
  s->host->counter_add(s->host, "samples", static_cast<int64_t>(out.size()));
  if (invalid) s->host->counter_add(s->host, "samples_flagged", invalid);
}

int create(const ballast_host_api* host, void** state) {
  auto s = std::unique_ptr<State>(new (std::nothrow) State{});
  if (!s) return BALLAST_ENOMEM;
  s->host = host;
  auto get = [host](const char* key, std::string* v) {
    const char* text = nullptr;
    if (host->config_get(host, key, &text) != BALLAST_OK || !text) return false;
    *v = text;
    return true;
  };
  auto bad = [host](const std::string& msg) {
    host->set_error(host, msg.c_str());
    return BALLAST_EINVAL;
  };
  std::string v;
  s->node = get("node", &v) ? v : host_node(host);
  if (get("period", &v)) {
    char* e = nullptr;
    s->period_s = std::strtod(v.c_str(), &e);
    if (*e || !(s->period_s >= 0.01)) return bad("config key 'period': expected seconds >= 0.01, got '" + v + "'");
  }
  NodeOptions o;
  if (get("system", &v)) o.system = v != "false";
  if (get("pids", &v)) {
    for (const auto& p : list_of(v)) {
      char* e = nullptr;
      long pid = std::strtol(p.c_str(), &e, 10);
      if (*e || pid <= 0) return bad("config key 'pids': not a process id: '" + p + "'");
      o.pids.push_back(static_cast<int>(pid));
    }
  }
  if (get("process", &v)) o.process_name = v;
  if (get("cgroup", &v)) o.cgroups = list_of(v);
  if (get("gpu", &v)) s->gpu = v != "false";
  if (get("nvml_library", &v)) s->nvml_library = v;
  HttpOptions http;
  if (get("scrape_timeout_ms", &v)) {
    char* e = nullptr;
    const long ms = std::strtol(v.c_str(), &e, 10);
    if (*e || ms < 1 || ms > 600000)
      return bad("config key 'scrape_timeout_ms': expected milliseconds in 1..600000, got '" + v + "'");
    http.timeout_ms = static_cast<int>(ms);
  }
  if (get("scrape_ca_file", &v)) http.ca_file = v;
  if (get("scrape_insecure", &v)) {
    if (v != "true" && v != "false")
      return bad("config key 'scrape_insecure': expected true or false, got '" + v + "'");
    http.insecure = v == "true";
  }
  if (get("scrape_username", &v)) http.username = v;
  std::string why;
  if (!secret(get, "scrape_password", &http.password, &why) ||
      !secret(get, "scrape_bearer_token", &http.bearer_token, &why))
    return bad(why);
  if (!http.password.empty() && http.username.empty())
    return bad("config key 'scrape_password': needs 'scrape_username'");
  std::string prefix;
  if (get("scrape_prefix", &v)) prefix = v;
  bool map_names = true;
  if (get("scrape_map", &v)) {
    if (v != "true" && v != "false") return bad("config key 'scrape_map': expected true or false, got '" + v + "'");
    map_names = v == "true";
  }
  if (get("scrape", &v)) {
    for (const auto& url : list_of(v)) {
      if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0)
        return bad("config key 'scrape': only http:// and https:// URLs, got '" + url + "'");
      s->scrapers.push_back(std::make_unique<Scraper>(url, prefix, http, map_names));
      s->scrape_errors.emplace_back();
    }
  }
  s->sampler = std::make_unique<NodeSampler>(std::move(o));
  *state = s.release();
  return BALLAST_OK;
}

int start(void* state) {
  auto* s = static_cast<State*>(state);
  if (s->gpu) {
    auto nvml = std::make_unique<Nvml>();
    std::string why;
    if (nvml->open(&why, s->nvml_library)) {
      std::string msg = "NVML: " + std::to_string(nvml->gpu_count()) + " GPU(s)";
      s->host->log(s->host, BALLAST_LOG_INFO, msg.c_str());
      s->nvml = std::move(nvml);
    } else {
      std::string msg = "no GPU metrics: " + why;
      s->host->log(s->host, BALLAST_LOG_INFO, msg.c_str());
    }
  }
  int rc = s->host->timer_start(s->host, static_cast<uint64_t>(s->period_s * 1e9), tick, s, &s->timer);
  if (rc == BALLAST_OK) s->timing = true;
  return rc;
}

void stop(void* state) {
  auto* s = static_cast<State*>(state);
  if (s->timing) s->host->timer_cancel(s->host, s->timer);
  s->timing = false;
}

void destroy(void* state) { delete static_cast<State*>(state); }

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor),
    BALLAST_ABI_MAJOR,
    BALLAST_ABI_MINOR,
    0,
    "collect",
    "0.1.0",
    "detector",
    "node collector: /proc, /sys, cgroups, job processes, NVML GPUs, Prometheus endpoints",
    create,
    start,
    stop,
    destroy,
    nullptr,
    nullptr};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t) { return &kDescriptor; }
