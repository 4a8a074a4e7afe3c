#include "link.hpp"

#include "error.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <mutex>

namespace ballast::cluster {

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// OpenSSL writes with write(): a peer gone would raise SIGPIPE and end the
// process. The link reports the broken connection instead.
void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] { signal(SIGPIPE, SIG_IGN); });
}

}  // namespace

std::string openssl_errors() {
  std::string out;
  unsigned long e;
  while ((e = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL detail" : out;
}

TlsConfig::~TlsConfig() {
  if (ctx_) SSL_CTX_free(ctx_);
}

int TlsConfig::load(const TlsFiles& files, bool server, std::unique_ptr<TlsConfig>* out) {
  for (auto [field, path] : {std::pair{"ca", &files.ca}, {"cert", &files.cert}, {"key", &files.key}})
    if (path->empty()) return fail(BALLAST_EINVAL, std::string("cluster.tls.") + field + ": a file is required");
  auto cfg = std::unique_ptr<TlsConfig>(new TlsConfig);
  ERR_clear_error();
  cfg->ctx_ = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (!cfg->ctx_) return fail(BALLAST_EIO, "TLS context: " + openssl_errors());
  SSL_CTX_set_min_proto_version(cfg->ctx_, TLS1_2_VERSION);
  SSL_CTX_set_mode(cfg->ctx_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Read ahead: one read() takes what the socket holds (up to 64 KiB), not a
  // record header and then its body. pump() reads until OpenSSL wants more
  // from the socket, so nothing whole stays buffered while it polls.
  SSL_CTX_set_read_ahead(cfg->ctx_, 1);
  SSL_CTX_set_default_read_buffer_len(cfg->ctx_, 64u << 10);
  if (SSL_CTX_use_certificate_chain_file(cfg->ctx_, files.cert.c_str()) != 1)
    return fail(BALLAST_EIO, "cluster.tls.cert " + files.cert + ": " + openssl_errors());
  if (SSL_CTX_use_PrivateKey_file(cfg->ctx_, files.key.c_str(), SSL_FILETYPE_PEM) != 1)
    return fail(BALLAST_EIO, "cluster.tls.key " + files.key + ": " + openssl_errors());
  if (SSL_CTX_check_private_key(cfg->ctx_) != 1)
    return fail(BALLAST_EINVAL, "cluster.tls.key " + files.key + " does not match " + files.cert);
  if (SSL_CTX_load_verify_locations(cfg->ctx_, files.ca.c_str(), nullptr) != 1)
    return fail(BALLAST_EIO, "cluster.tls.ca " + files.ca + ": " + openssl_errors());
  // Both ways: the server demands a client certificate.
  SSL_CTX_set_verify(cfg->ctx_, SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), nullptr);
  cfg->server_name_ = files.server_name;
  *out = std::move(cfg);
  return BALLAST_OK;
}

Link::~Link() {
  if (ssl_) SSL_free(ssl_);
  if (fd_ >= 0) ::close(fd_);
}

int Link::connect(const TlsConfig& tls, const std::string& address, int timeout_ms, std::unique_ptr<Link>* out,
                  std::string* error) {
  ignore_sigpipe();
  std::string host;
  uint16_t port = 0;
  if (!split_host_port(address, &host, &port, error)) return BALLAST_EINVAL;
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    *error = address + ": " + gai_strerror(rc);
    return BALLAST_EIO;
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    *error = std::string("socket: ") + std::strerror(errno);
    return BALLAST_EIO;
  }
  auto link = std::unique_ptr<Link>(new Link);
  link->fd_ = fd;
  link->peer_address_ = address;
  int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  int64_t deadline = now_ms() + timeout_ms;
  if (rc != 0 && errno != EINPROGRESS) {
    *error = address + ": connect: " + std::strerror(errno);
    return BALLAST_EIO;
  }
  if (rc != 0) {
    pollfd p{fd, POLLOUT, 0};
    int n = poll(&p, 1, timeout_ms);
    int err = 0;
    socklen_t len = sizeof err;
    if (n <= 0) {
      *error = address + ": connect: timed out after " + std::to_string(timeout_ms) + " ms";
      return BALLAST_EIO;
    }
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      *error = address + ": connect: " + std::strerror(err);
      return BALLAST_EIO;
    }
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ERR_clear_error();
  link->ssl_ = SSL_new(tls.ctx());
  SSL_set_fd(link->ssl_, fd);
  SSL_set1_host(link->ssl_, tls.server_name().c_str());
  SSL_set_tlsext_host_name(link->ssl_, tls.server_name().c_str());
  if (int h = link->handshake(false, static_cast<int>(std::max<int64_t>(1, deadline - now_ms())), error);
      h != BALLAST_OK) {
    *error = address + ": " + *error;
    return h;
  }
  *out = std::move(link);
  return BALLAST_OK;
}

std::unique_ptr<Link> Link::accept(const TlsConfig& tls, int fd, const std::string& peer_address) {
  ignore_sigpipe();
  auto link = std::unique_ptr<Link>(new Link);
  link->fd_ = fd;
  link->peer_address_ = peer_address;
  set_nonblocking(fd);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ERR_clear_error();
  link->ssl_ = SSL_new(tls.ctx());
  SSL_set_fd(link->ssl_, fd);
  SSL_set_accept_state(link->ssl_);
  return link;
}

int Link::handshake_step(std::string* error) {
  ERR_clear_error();
  int rc = SSL_do_handshake(ssl_);
  want_write_ = false;
  if (rc != 1) {
    int err = SSL_get_error(ssl_, rc);
    if (err == SSL_ERROR_WANT_READ) return 0;
    if (err == SSL_ERROR_WANT_WRITE) {
      want_write_ = true;
      return 0;
    }
    long verify = SSL_get_verify_result(ssl_);
    *error = "TLS handshake failed: " + openssl_errors();
    if (verify != X509_V_OK) *error += std::string(" (certificate: ") + X509_verify_cert_error_string(verify) + ")";
    if (err == SSL_ERROR_SYSCALL) *error += " (peer closed the connection)";
    return -1;
  }
  X509* cert = SSL_get_peer_certificate(ssl_);
  if (cert == nullptr) {
    *error = "no client certificate";
    return -1;
  }
  char cn[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
  X509_free(cert);
  peer_name_ = cn;
  return 1;
}

int Link::handshake(bool server, int timeout_ms, std::string* error) {
  int64_t deadline = now_ms() + timeout_ms;
  for (;;) {
    int rc = server ? SSL_accept(ssl_) : SSL_connect(ssl_);
    if (rc == 1) break;
    int err = SSL_get_error(ssl_, rc);
    short events = err == SSL_ERROR_WANT_READ ? POLLIN : err == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
    if (events == 0) {
      long verify = SSL_get_verify_result(ssl_);
      *error = "TLS handshake failed: " + openssl_errors();
      if (verify != X509_V_OK) *error += std::string(" (certificate: ") + X509_verify_cert_error_string(verify) + ")";
      if (err == SSL_ERROR_SYSCALL) *error += " (peer closed the connection)";
      return BALLAST_EPEER;
    }
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      *error = "TLS handshake timed out after " + std::to_string(timeout_ms) + " ms";
      return BALLAST_ETIMEDOUT;
    }
    pollfd p{fd_, events, 0};
    poll(&p, 1, static_cast<int>(left));
  }
  return BALLAST_OK;
}

void Link::send(MsgType type, uint64_t number, const void* body, size_t body_size) {
  if (out_at_ > 0 && out_at_ == out_.size()) {
    out_.clear();
    out_at_ = 0;
  }
  encode_message(type, number, body, body_size, &out_);
}

bool Link::write_out(std::string* error) {
  if (out_at_ == out_.size()) return true;
  want_write_ = false;
  while (out_at_ < out_.size()) {
    ERR_clear_error();
    size_t chunk = std::min<size_t>(out_.size() - out_at_, 1u << 20);
    int n = SSL_write(ssl_, out_.data() + out_at_, static_cast<int>(chunk));
    if (n > 0) {
      out_at_ += static_cast<size_t>(n);
      continue;
    }
    int err = SSL_get_error(ssl_, n);
    if (err == SSL_ERROR_WANT_WRITE || err == SSL_ERROR_WANT_READ) {
      want_write_ = err == SSL_ERROR_WANT_WRITE;
      return true;
    }
    *error = "write: " + (err == SSL_ERROR_SYSCALL ? std::string(std::strerror(errno)) : openssl_errors());
    return false;
  }
  out_.clear();
  out_at_ = 0;
  return true;
}

int Link::read_in(size_t max_bytes, bool until_blocked, std::string* error) {
  want_write_ = false;
  // Straight into the input buffer, its consumed head dropped first.
  if (in_at_ > 0) {
    std::memmove(in_.get(), in_.get() + in_at_, in_len_ - in_at_);
    in_len_ -= in_at_;
    in_at_ = 0;
  }
  for (size_t got = 0;;) {
    if (got >= max_bytes) return 0;
    constexpr size_t kReadSize = 64 << 10;
    if (in_cap_ - in_len_ < kReadSize) {
      size_t cap = std::max(in_cap_ * 2, in_len_ + kReadSize);
      auto bigger = std::make_unique_for_overwrite<unsigned char[]>(cap);
      if (in_len_ > 0) std::memcpy(bigger.get(), in_.get(), in_len_);
      in_ = std::move(bigger);
      in_cap_ = cap;
    }
    ERR_clear_error();
    int n = SSL_read(ssl_, in_.get() + in_len_, static_cast<int>(kReadSize));
    if (n > 0) {
      in_len_ += static_cast<size_t>(n);
      got += static_cast<size_t>(n);
      // Less than asked and nothing buffered: the socket is most likely
      // drained, and a caller that polls it again learns it without a read.
      if (!until_blocked && static_cast<size_t>(n) < kReadSize && !SSL_has_pending(ssl_)) return 1;
      continue;
    }
    int err = SSL_get_error(ssl_, n);
    if (err == SSL_ERROR_WANT_READ) return 1;
    if (err == SSL_ERROR_WANT_WRITE) {
      want_write_ = true;
      return 1;
    }
    if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && n == 0)) {
      *error = "closed by the peer";
      return -1;
    }
    *error = "read: " + (err == SSL_ERROR_SYSCALL ? std::string(std::strerror(errno)) : openssl_errors());
    return -1;
  }
}

bool Link::deliver(const std::function<bool(const Message&)>& on_message, std::string* error) {
  while (in_at_ < in_len_) {
    Message m{};
    size_t used = 0;
    int r = decode_message(in_.get() + in_at_, in_len_ - in_at_, &m, &used, error);
    if (r < 0) return false;
    if (r == 0) break;
    in_at_ += used;
    if (!on_message(m)) {
      if (error->empty()) *error = "message refused";
      return false;
    }
  }
  return true;
}

bool Link::receive(size_t max_bytes, const std::function<bool(const Message&)>& on_message, bool* more,
                   std::string* error) {
  int r = read_in(max_bytes, false, error);
  *more = r == 0;
  // What arrived whole before a close is still handed over.
  return deliver(on_message, error) && r >= 0;
}

bool Link::flush(std::string* error) { return write_out(error); }

bool Link::pump(int timeout_ms, int wake_fd, const std::function<bool(const Message&)>& on_message,
                std::string* error) {
  for (int round = 0; round < 2; ++round) {
    if (!write_out(error)) return false;
    if (read_in(SIZE_MAX, true, error) < 0) return false;
    const size_t from = in_at_;
    if (!deliver(on_message, error)) return false;
    // Messages read: return, so that the caller acts on them (journals,
    // acknowledges) before waiting. Their bodies stay valid until the next pump.
    if (round == 1 || timeout_ms == 0 || in_at_ > from) break;
    pollfd p[2] = {{fd_, static_cast<short>(POLLIN | (wants_write() ? POLLOUT : 0)), 0}, {wake_fd, POLLIN, 0}};
    if (SSL_pending(ssl_) > 0) continue;
    int n = poll(p, wake_fd >= 0 ? 2 : 1, timeout_ms);
    if (n < 0 && errno != EINTR) {
      *error = std::string("poll: ") + std::strerror(errno);
      return false;
    }
    if (n > 0 && (p[0].revents & (POLLERR | POLLHUP)) && !(p[0].revents & POLLIN)) {
      *error = "connection reset";
      return false;
    }
  }
  return true;
}

}  // namespace ballast::cluster
