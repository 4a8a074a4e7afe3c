// One authenticated connection of the cluster link: TCP + mutual TLS
// (OpenSSL), non-blocking: the agent's thread calls pump(), the controller's
// event loops drive many links with handshake_step(), receive() and flush().
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
  // The server side of an accepted socket, its handshake not begun (the Link
  // owns fd from now on); handshake_step() drives it without waiting.
  static std::unique_ptr<Link> accept(const TlsConfig& tls, int fd, const std::string& peer_address);
  // One step of the server handshake: 1 done (peer_name() set), 0 when it
  // needs the socket again (wants_write() says whether writable), -1 failed
  // (*error says why).
  int handshake_step(std::string* error);

  // Queue a message; pump() writes it.
  void send(MsgType type, uint64_t number, const void* body = nullptr, size_t body_size = 0);
  size_t queued_bytes() const { return out_.size() - out_at_; }

  // Write what is queued and read what arrived; when nothing arrived, wait up to timeout_ms for
  // the socket (or for wake_fd to become readable, when >= 0). Each message
  // read goes to on_message; returning false from it stops and reports the
  // link broken. False when the link is closed or broken (*error says why).
  // A message's body stays valid until the next pump().
  bool pump(int timeout_ms, int wake_fd, const std::function<bool(const Message&)>& on_message, std::string* error);

  // Without waiting: read what arrived, at most about max_bytes (*more set
  // when it stopped there: more may be waiting; otherwise the socket's
  // readiness tells), and hand each whole message
  // to on_message. A body stays valid until the next receive(). False when
  // the link is closed or broken, or on_message returned false.
  bool receive(size_t max_bytes, const std::function<bool(const Message&)>& on_message, bool* more, std::string* error);
  // Write what is queued without waiting; false when broken.
  bool flush(std::string* error);
  // The socket must become writable for the link to go on.
  bool wants_write() const { return want_write_ || out_at_ < out_.size(); }

  const std::string& peer_name() const { return peer_name_; }  // certificate common name
  const std::string& peer_address() const { return peer_address_; }
  int fd() const { return fd_; }  // for a caller that polls many links

 private:
  Link() = default;
  int handshake(bool server, int timeout_ms, std::string* error);
  bool write_out(std::string* error);
  // Read until OpenSSL wants the socket (or, unless until_blocked, a read
  // took less than asked and OpenSSL holds nothing more) or max_bytes are
  // read; 1 read all, 0 stopped at max_bytes, -1 broken.
  int read_in(size_t max_bytes, bool until_blocked, std::string* error);
  bool deliver(const std::function<bool(const Message&)>& on_message, std::string* error);

  int fd_ = -1;
  SSL* ssl_ = nullptr;
  std::vector<unsigned char> out_;
  size_t out_at_ = 0;
  bool want_write_ = false;
  std::unique_ptr<unsigned char[]> in_;  // [0, in_at_) handed out, [in_at_, in_len_) not yet whole messages
  size_t in_cap_ = 0, in_len_ = 0, in_at_ = 0;
  std::string peer_name_, peer_address_;
};

// The OpenSSL error queue as one line (and cleared).
std::string openssl_errors();

}  // namespace ballast::cluster
