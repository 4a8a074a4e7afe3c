#include "http_client.hpp"

#include <curl/curl.h>

#include <mutex>
#include <utility>

namespace ballast::collect {

namespace {

struct Sink {
  std::string* body;
  size_t max;
  bool too_large = false;
};

size_t on_data(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  if (sink->body->size() + size * n > sink->max) {
    sink->too_large = true;
    return 0;  // ends the transfer
  }
  sink->body->append(data, size * n);
  return size * n;
}

}  // namespace

HttpClient::HttpClient(HttpOptions options) : options_(std::move(options)) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
}

HttpClient::~HttpClient() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

bool HttpClient::get(const std::string& url, std::string* body, std::string* error) {
  auto fail = [&](const std::string& what) {
    *error = url + ": " + what;
    return false;
  };
  CURL* c = static_cast<CURL*>(curl_);
  if (c == nullptr) return fail("curl_easy_init failed");
  if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0)
    return fail("only http:// and https:// URLs are supported");
  body->clear();
  Sink sink{body, options_.max_body};
  char message[CURL_ERROR_SIZE] = {};
  curl_slist* headers = curl_slist_append(nullptr, "Accept: text/plain;version=0.0.4");
  const std::string bearer = "Authorization: Bearer " + options_.bearer_token;
  if (!options_.bearer_token.empty()) headers = curl_slist_append(headers, bearer.c_str());
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "ballast-collect");
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, message);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, long(options_.timeout_ms));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);         // the host's timer thread: no SIGALRM
  curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");  // gzip when the exporter offers it
  if (!options_.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, options_.ca_file.c_str());
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, options_.insecure ? 0L : 1L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, options_.insecure ? 0L : 2L);
  if (!options_.username.empty()) {
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, long(CURLAUTH_BASIC));
    curl_easy_setopt(c, CURLOPT_USERNAME, options_.username.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, options_.password.c_str());
  }
  const CURLcode rc = curl_easy_perform(c);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, nullptr);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, nullptr);
  curl_slist_free_all(headers);
  long opened = 0;
  if (curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &opened) == CURLE_OK) connections_ += opened;
  if (sink.too_large) return fail("response larger than " + std::to_string(options_.max_body >> 20) + " MiB");
  if (rc != CURLE_OK) return fail(message[0] ? message : curl_easy_strerror(rc));
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200) return fail("HTTP status " + std::to_string(status));
  return true;
}

bool http_get(const std::string& url, int timeout_ms, std::string* body, std::string* error) {
  HttpOptions o;
  o.timeout_ms = timeout_ms;
  return HttpClient(o).get(url, body, error);
}

}  // namespace ballast::collect
