#include "channel.hpp"

#include <algorithm>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

namespace ballast::runner {

namespace {

constexpr size_t kMaxDatagram = 64 * 1024;
constexpr size_t kMaxOps = 4096;

bool number(const nlohmann::json& j, const char* key, double* out, std::string* error, bool required = true) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) *error = std::string("missing field '") + key + "'";
    return !required;
  }
  if (!it->is_number()) {
    *error = std::string("field '") + key + "' is not a number";
    return false;
  }
  *out = it->get<double>();
  return true;
}

bool text(const nlohmann::json& j, const char* key, std::string* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return false;
  *out = it->get<std::string>();
  return true;
}

}  // namespace

std::optional<Report> parse_report(const std::string& datagram, int world, std::string* error) {
  if (datagram.size() > kMaxDatagram) {
    *error = "report larger than 64 KiB";
    return std::nullopt;
  }
  // NaN and Infinity are not JSON; a trainer that prints a NaN loss as a bare
  // NaN token gets it read as such rather than the report dropped.
  nlohmann::json j = nlohmann::json::parse(datagram, nullptr, false);
  bool nan_loss = false;
  if (j.is_discarded()) {
    std::string fixed = datagram;
    for (const char* bad : {"-Infinity", "Infinity", "NaN", "nan", "-nan", "inf", "-inf"}) {
      const std::string key = std::string("\"loss\": ") + bad, key2 = std::string("\"loss\":") + bad;
      for (const auto& k : {key, key2})
        if (auto pos = fixed.find(k); pos != std::string::npos) {
          fixed.replace(pos, k.size(), "\"loss\": null");
          nan_loss = true;
        }
    }
    j = nlohmann::json::parse(fixed, nullptr, false);
  }
  if (j.is_discarded() || !j.is_object()) {
    *error = "not a JSON object";
    return std::nullopt;
  }
  Report r;
  if (!text(j, "type", &r.type)) {
    *error = "missing field 'type'";
    return std::nullopt;
  }
  static const char* kTypes[] = {"hello", "step", "checkpoint", "error", "done"};
  bool known = false;
  for (const char* t : kTypes) known = known || r.type == t;
  if (!known) {
    *error = "unknown type '" + r.type + "'";
    return std::nullopt;
  }
  double v = 0;
  if (!number(j, "rank", &v, error)) return std::nullopt;
  if (v < 0 || v >= world || v != std::floor(v)) {
    *error = "rank " + j["rank"].dump() + " is not in [0, " + std::to_string(world) + ")";
    return std::nullopt;
  }
  r.rank = int(v);
  if (!number(j, "step", &v, error, r.type != "hello" && r.type != "error")) return std::nullopt;
  if (j.contains("step")) r.step = int64_t(v);
  if (r.type == "hello") {
    if (number(j, "pid", &v, error, false) && j.contains("pid")) r.pid = int(v);
    if (number(j, "attempt", &v, error, false) && j.contains("attempt")) r.attempt = int(v);
    error->clear();
  } else if (r.type == "step") {
    auto it = j.find("loss");
    if (it != j.end() && it->is_number()) {
      r.loss = it->get<double>();
      r.loss_finite = std::isfinite(r.loss);
    } else if (nan_loss || (it != j.end() && it->is_null())) {
      r.loss = std::nan("");
      r.loss_finite = false;
    }
    if (!number(j, "start_s", &r.start_s, error) || !number(j, "duration_s", &r.duration_s, error)) return std::nullopt;
    if (auto ops = j.find("ops"); ops != j.end()) {
      if (!ops->is_array() || ops->size() > kMaxOps) {
        *error = "field 'ops' is not a list of at most 4096 operations";
        return std::nullopt;
      }
      for (const auto& o : *ops) {
        OpReport op;
        if (!o.is_object() || !text(o, "optype", &op.optype) || !number(o, "start_s", &op.start_s, error) ||
            !number(o, "duration_s", &op.duration_s, error)) {
          *error = "an entry of 'ops' lacks optype, start_s or duration_s";
          return std::nullopt;
        }
        r.ops.push_back(std::move(op));
      }
    }
  } else if (r.type == "checkpoint") {
    if (!text(j, "path", &r.path)) {
      *error = "missing field 'path'";
      return std::nullopt;
    }
    if (number(j, "bytes", &v, error, false) && j.contains("bytes")) r.bytes = uint64_t(v);
    number(j, "seconds", &r.seconds, error, false);
    error->clear();
  } else if (r.type == "error") {
    text(j, "kind", &r.kind);
    text(j, "message", &r.message);
    if (r.kind.empty()) r.kind = "internal";
  }
  return r;
}

ReportSocket::~ReportSocket() { close(); }

bool ReportSocket::open(const std::string& path, std::string* error) {
  sockaddr_un sa{};
  if (path.size() >= sizeof sa.sun_path) {
    *error = "socket path too long (" + std::to_string(path.size()) + " bytes): " + path;
    return false;
  }
  fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    *error = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  const int buf = 4 << 20;  // a burst of step reports from many ranks
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(path.c_str());
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  if (bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    *error = "bind " + path + ": " + std::strerror(errno);
    close();
    return false;
  }
  path_ = path;
  if (lstat(path.c_str(), &st) == 0) inode_ = st.st_ino;
  return true;
}

bool ReportSocket::answers(const std::string& path) {
  sockaddr_un sa{};
  if (path.size() >= sizeof sa.sun_path) return false;
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  const bool live = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);
  return live;
}

std::vector<std::string> ReportSocket::drain() {
  std::vector<std::string> out;
  if (fd_ < 0) return out;
  std::string buf(kMaxDatagram + 1, '\0');
  for (int i = 0; i < 10000; ++i) {
    const ssize_t n = recv(fd_, buf.data(), buf.size(), 0);
    if (n < 0) break;
    out.emplace_back(buf.data(), size_t(n));
  }
  return out;
}

void ReportSocket::close() {
  // Unlinked before the socket closes (no other executor takes the path
  // while this one is bound), and only while the path is still this socket.
  struct stat st {};
  if (!path_.empty() && lstat(path_.c_str(), &st) == 0 && st.st_ino == inode_) unlink(path_.c_str());
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  path_.clear();
}

bool ControlFile::open(const std::string& path, bool keep, std::string* error) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | (keep ? 0 : O_TRUNC) | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot create " + path + ": " + std::strerror(errno);
    return false;
  }
  seq_ = 0;
  char buf[65536];
  for (ssize_t n; keep && (n = ::read(fd, buf, sizeof buf)) > 0;) seq_ += uint64_t(std::count(buf, buf + n, '\n'));
  ::close(fd);
  path_ = path;
  return true;
}

bool ControlFile::send(const std::string& command, int rank, const std::string& extra, std::string* error) {
  nlohmann::json j = {{"seq", seq_ + 1}, {"command", command}, {"rank", rank}};
  if (!extra.empty()) {
    nlohmann::json e = nlohmann::json::parse(extra, nullptr, false);
    if (e.is_object())
      for (auto& [k, v] : e.items()) j[k] = v;
  }
  const std::string line = j.dump() + "\n";
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) {
    *error = "cannot open " + path_ + ": " + std::strerror(errno);
    return false;
  }
  // One write of a whole line: a rank never reads half a command that it
  // takes for whole (it ignores a line without its newline until later).
  const bool ok = write(fd, line.data(), line.size()) == ssize_t(line.size());
  if (!ok) *error = "write " + path_ + ": " + std::strerror(errno);
  ::close(fd);
  if (ok) ++seq_;
  return ok;
}

}  // namespace ballast::runner
