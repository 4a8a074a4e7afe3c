// One authenticated connection of the cluster link: TCP + mutual TLS
// (OpenSSL), non-blocking, driven by one thread that calls pump().
//
// Both ends present a certificate signed by the configured CA and verify the
// other's: the agent checks that the controller's certificate names
// `server_name`; the controller reads the agent's common name (peer_name())
// and accepts only a HELLO for that node. A peer that fails the handshake
// never gets a message through.
// Thread-safety: a Link belongs to one thread; TlsConfig is immutable after
// load and may be shared.
#pragma once

#include "wire.hpp"

#include <functional>
#include <memory>
#include <string>
#include <vector>

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace ballast::cluster {

struct TlsFiles {
  std::string ca, cert, key;
  std::string server_name = "ballast-controller";  // what the agent expects the controller's cert to name
};

class TlsConfig {
 public:
  ~TlsConfig();
  // Load the files; status, the message names the file and OpenSSL's reason.
  static int load(const TlsFiles& files, bool server, std::unique_ptr<TlsConfig>* out);
  SSL_CTX* ctx() const { return ctx_; }
  const std::string& server_name() const { return server_name_; }

 private:
  SSL_CTX* ctx_ = nullptr;
  std::string server_name_;
};

class Link {
 public:
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Connect to host:port and complete the TLS handshake within timeout_ms.
  static int connect(const TlsConfig& tls, const std::string& address, int timeout_ms, std::unique_ptr<Link>* out,
                     std::string* error);
  // Complete the server side of the handshake on an accepted socket (the Link
  // owns fd from now on, also on failure).
  static int accept(const TlsConfig& tls, int fd, const std::string& peer_address, int timeout_ms,
                    std::unique_ptr<Link>* out, std::string* error);

  // Queue a message; pump() writes it.
  void send(MsgType type, uint64_t number, const void* body = nullptr, size_t body_size = 0);
  size_t queued_bytes() const { return out_.size() - out_at_; }

  // Write what is queued and read what arrived; when nothing arrived, wait up to timeout_ms for
  // the socket (or for wake_fd to become readable, when >= 0). Each message
  // read goes to on_message; returning false from it stops and reports the
  // link broken. False when the link is closed or broken (*error says why).
  // A message's body stays valid until the next pump().
  bool pump(int timeout_ms, int wake_fd, const std::function<bool(const Message&)>& on_message, std::string* error);

  const std::string& peer_name() const { return peer_name_; }  // certificate common name
  const std::string& peer_address() const { return peer_address_; }
  int fd() const { return fd_; }  // for a caller that polls many links

 private:
  Link() = default;
  int handshake(bool server, int timeout_ms, std::string* error);

  int fd_ = -1;
  SSL* ssl_ = nullptr;
  std::vector<unsigned char> out_;
  size_t out_at_ = 0;
  std::unique_ptr<unsigned char[]> in_;  // [0, in_at_) handed out, [in_at_, in_len_) not yet whole messages
  size_t in_cap_ = 0, in_len_ = 0, in_at_ = 0;
  std::string peer_name_, peer_address_;
};

// The OpenSSL error queue as one line (and cleared).
std::string openssl_errors();

}  // namespace ballast::cluster
