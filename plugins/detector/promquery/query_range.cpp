#include "query_range.hpp"

#include <curl/curl.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <mutex>

namespace ballast::promquery {

namespace {

size_t on_data(char* data, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::string*>(user);
  if (out->size() + size * n > (64u << 20)) return 0;  // bounded reply
  out->append(data, size * n);
  return size * n;
}

std::string escape(CURL* c, const std::string& s) {
  char* e = curl_easy_escape(c, s.c_str(), static_cast<int>(s.size()));
  std::string out = e ? e : "";
  curl_free(e);
  return out;
}

}  // namespace

bool query_range(const std::string& url, const std::string& query, double start, double end, double step,
                 const std::string& node_label, std::vector<Series>* out, std::string* error, long timeout_ms) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  CURL* c = curl_easy_init();
  if (c == nullptr) {
    *error = "curl_easy_init failed";
    return false;
  }
  char range[128];
  std::snprintf(range, sizeof range, "&start=%.3f&end=%.3f&step=%.3f", start, end, step);
  std::string full = url + "/api/v1/query_range?query=" + escape(c, query) + range;
  std::string body;
  curl_easy_setopt(c, CURLOPT_URL, full.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(c);
  if (rc != CURLE_OK) {
    *error = url + "/api/v1/query_range: " + curl_easy_strerror(rc);
    return false;
  }
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    *error = url + "/api/v1/query_range: HTTP " + std::to_string(status) + ", not JSON: " + body.substr(0, 200);
    return false;
  }
  if (j.value("status", "") != "success") {
    *error =
        url + "/api/v1/query_range (" + query + "): " + j.value("errorType", "error") + ": " + j.value("error", "");
    return false;
  }
  const auto& data = j["data"];
  if (!data.is_object() || data.value("resultType", "") != "matrix" || !data["result"].is_array()) {
    *error = url + "/api/v1/query_range: expected a matrix result";
    return false;
  }
  out->clear();
  for (const auto& r : data["result"]) {
    Series s;
    if (r.contains("metric") && r["metric"].contains(node_label) && r["metric"][node_label].is_string())
      s.node = r["metric"][node_label].get<std::string>();
    if (s.node.empty()) continue;  // a series without the node label names no machine
    if (r.contains("values") && r["values"].is_array())
      for (const auto& v : r["values"]) {
        if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_string()) continue;
        // Values come as strings ("NaN", "+Inf" included).
        s.points.emplace_back(v[0].get<double>(), std::strtod(v[1].get<std::string>().c_str(), nullptr));
      }
    out->push_back(std::move(s));
  }
  return true;
}

}  // namespace ballast::promquery
