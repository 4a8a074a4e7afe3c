#include "metrics_http.hpp"

#include "error.hpp"

#include <ballast/status.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include <charconv>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace ballast {

int parse_listen(const std::string& listen, std::string* host, uint16_t* port) {
  std::string h = "127.0.0.1", p = listen;
  if (!listen.empty() && listen[0] == '[') {
    const size_t close = listen.find("]:");
    if (close == std::string::npos)
      return fail(BALLAST_EINVAL, "listen address '" + listen + "': expected [IPV6]:PORT");
    h = listen.substr(1, close - 1);
    p = listen.substr(close + 2);
  } else if (const size_t colon = listen.rfind(':'); colon != std::string::npos) {
    if (colon > 0) h = listen.substr(0, colon);
    p = listen.substr(colon + 1);
  }
  unsigned value = 0;
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), value);
  if (p.empty() || ec != std::errc() || end != p.data() + p.size() || value > 65535)
    return fail(BALLAST_EINVAL, "listen address '" + listen + "': expected HOST:PORT, :PORT or PORT (0..65535)");
  *host = h;
  *port = static_cast<uint16_t>(value);
  return BALLAST_OK;
}

namespace {

// libmicrohttpd's messages (why a bind failed) for the error we return.
void keep_message(void* cls, const char* fmt, va_list ap) {
  char text[512];
  std::vsnprintf(text, sizeof text, fmt, ap);
  auto* message = static_cast<std::string*>(cls);
  if (message->empty()) *message = text;
  while (!message->empty() && (message->back() == '\n' || message->back() == '.')) message->pop_back();
}

enum MHD_Result reply(struct MHD_Connection* connection, unsigned status, const std::string& body,
                      const char* content_type) {
  struct MHD_Response* response =
      MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  const enum MHD_Result rc = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return rc;
}

}  // namespace

// libmicrohttpd's request handler: GET or HEAD /metrics.
struct MetricsRequest {
  static enum MHD_Result on_request(void* cls, struct MHD_Connection* connection, const char* url, const char* method,
                                    const char*, const char*, size_t* upload_size, void**) {
    if (upload_size != nullptr && *upload_size != 0) {
      *upload_size = 0;  // a body is not for us: dropped
      return MHD_YES;
    }
    const char* text = "text/plain; charset=utf-8";
    if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "HEAD") != 0)
      return reply(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n", text);
    if (std::strcmp(url, "/metrics") != 0)
      return reply(connection, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n", text);
    try {
      const std::string body = static_cast<MetricsHttp*>(cls)->render_();
      return reply(connection, MHD_HTTP_OK, body, "text/plain; version=0.0.4; charset=utf-8");
    } catch (const std::exception& e) {
      return reply(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, std::string("metrics: ") + e.what() + "\n", text);
    }
  }
};

int MetricsHttp::open(const std::string& listen, Render render, std::unique_ptr<MetricsHttp>* out) {
  std::string host;
  uint16_t port = 0;
  if (int rc = parse_listen(listen, &host, &port); rc != BALLAST_OK) return rc;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0 || found == nullptr)
    return fail(BALLAST_EINVAL, "listen address '" + listen + "': " + gai_strerror(rc));
  sockaddr_storage address{};
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  const bool v6 = found->ai_family == AF_INET6;
  freeaddrinfo(found);

  auto http = std::unique_ptr<MetricsHttp>(new MetricsHttp());
  http->render_ = std::move(render);
  const unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
  http->daemon_ = MHD_start_daemon(flags, port, nullptr, nullptr, MetricsRequest::on_request, http.get(),  //
                                   MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&address),
                                   MHD_OPTION_EXTERNAL_LOGGER, keep_message, &http->message_,  //
                                   MHD_OPTION_CONNECTION_LIMIT, 16u,                           //
                                   MHD_OPTION_CONNECTION_TIMEOUT, 10u,                         //
                                   MHD_OPTION_END);
  if (http->daemon_ == nullptr) {
    const std::string& why = http->message_;
    return fail(BALLAST_EIO, "cannot serve metrics on " + listen + ": " + (why.empty() ? "bind failed" : why));
  }
  const union MHD_DaemonInfo* info = MHD_get_daemon_info(http->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  const uint16_t bound = info != nullptr ? info->port : port;
  http->url_ = "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(bound) + "/metrics";
  *out = std::move(http);
  return BALLAST_OK;
}

MetricsHttp::~MetricsHttp() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace ballast
