// HTTP(S) GET through libcurl for the Prometheus scraper: TLS (a CA file, or
// verification off), basic auth or a bearer token, and one connection kept
// alive across scrapes of an endpoint.
#pragma once

#include <string>

namespace ballast::collect {

struct HttpOptions {
  int timeout_ms = 500;   // the whole request, connection included
  std::string ca_file;    // PEM CA bundle to verify the server with (default: the system's)
  bool insecure = false;  // do not verify the server's certificate (tests, self-signed exporters)
  std::string username;   // basic auth when not empty
  std::string password;
  std::string bearer_token;     // Authorization: Bearer ... when not empty
  size_t max_body = 64u << 20;  // a larger response is an error
};

// One client per endpoint and thread: it keeps its connection open between
// calls. Not thread-safe.
class HttpClient {
 public:
  explicit HttpClient(HttpOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // GET url (http:// or https://) into *body. False with *error naming the
  // URL: a connection or TLS error, a timeout, a status other than 200, a
  // body over max_body.
  bool get(const std::string& url, std::string* body, std::string* error);

  // Connections opened so far (1 after any number of calls that could reuse it).
  long connections() const { return connections_; }

 private:
  HttpOptions options_;
  void* curl_ = nullptr;  // CURL*
  long connections_ = 0;
};

// One GET with a fresh client.
bool http_get(const std::string& url, int timeout_ms, std::string* body, std::string* error);

}  // namespace ballast::collect
