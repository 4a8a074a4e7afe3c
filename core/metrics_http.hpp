// The HTTP side of the host's /metrics (host_metrics.hpp): libmicrohttpd
// serving GET /metrics from its own thread, a few connections at a time.
// render() is called once per scrape, from that thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

struct MHD_Daemon;

namespace ballast {

// "HOST:PORT", "[IPV6]:PORT", ":PORT" or "PORT" (the last two on 127.0.0.1:
// loopback unless an address is named). Status; the message names the value.
int parse_listen(const std::string& listen, std::string* host, uint16_t* port);

class MetricsHttp {
 public:
  using Render = std::function<std::string()>;
  // Bind and serve; port 0 picks a free one (url() names it).
  static int open(const std::string& listen, Render render, std::unique_ptr<MetricsHttp>* out);
  ~MetricsHttp();  // stops serving: no render() runs after it returns
  MetricsHttp(const MetricsHttp&) = delete;
  MetricsHttp& operator=(const MetricsHttp&) = delete;

  const std::string& url() const { return url_; }  // http://HOST:PORT/metrics

 private:
  MetricsHttp() = default;
  friend struct MetricsRequest;

  MHD_Daemon* daemon_ = nullptr;
  Render render_;
  std::string url_;
  std::string message_;  // libmicrohttpd's first message (why it could not bind)
};

}  // namespace ballast
