#include "job_channel.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace trainer {

namespace {

constexpr size_t kMaxReport = 64 * 1024;
constexpr int kFullWaitMs = 1000;            // how long a report other than a step's waits for room
constexpr size_t kMaxReadPerPoll = 1 << 20;  // a burst of commands is read over several boundaries

uint64_t parse_step(const std::string& item, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end || errno || text[0] == '-' || v == 0)
    throw std::runtime_error("BALLAST_INJECT: '" + item + "': the step must be a positive integer");
  return v;
}

}  // namespace

double wall_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

JobChannel::JobChannel(std::string socket_path, std::string control_path, int rank)
    : socket_path_(std::move(socket_path)), control_path_(std::move(control_path)), rank_(rank) {
  // The lines already there were for the ranks of earlier attempts.
  struct stat st {};
  if (!control_path_.empty() && ::stat(control_path_.c_str(), &st) == 0) offset_ = uint64_t(st.st_size);
  if (socket_path_.empty()) return;
  if (socket_path_.size() >= sizeof(sockaddr_un{}.sun_path))
    throw std::runtime_error("BALLAST_JOB_SOCKET: '" + socket_path_ + "' is longer than a socket path may be");
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) throw std::runtime_error(std::string("BALLAST_JOB_SOCKET: socket: ") + std::strerror(errno));
}

JobChannel::~JobChannel() {
  if (fd_ >= 0) ::close(fd_);
}

void JobChannel::report(const char* type, nlohmann::json fields) {
  if (fd_ < 0) return;
  fields["type"] = type;
  fields["rank"] = rank_;
  const std::string text = fields.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > kMaxReport) return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path_.data(), socket_path_.size());
  // The receiver's queue holds only net.unix.max_dgram_qlen datagrams (10 by default): a step
  // report it has no room for is dropped (the next one carries the same progress), the others
  // (hello, checkpoint, done, error: what the executor learns nowhere else) wait for room, up to
  // kFullWaitMs. An executor gone (no socket, refused) drops them at once.
  const bool may_drop = std::strcmp(type, "step") == 0;
  for (int waited_ms = 0;; ++waited_ms) {
    const ssize_t n = ::sendto(fd_, text.data(), text.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr),
                               socklen_t(sizeof addr));
    if (n >= 0 || may_drop || errno != EAGAIN || waited_ms >= kFullWaitMs) return;
    ::usleep(1000);
  }
}

std::vector<JobChannel::Command> JobChannel::poll() {
  std::vector<Command> out;
  if (control_path_.empty()) return out;
  const int fd = ::open(control_path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;  // not written yet
  struct stat st {};
  if (::fstat(fd, &st) == 0 && uint64_t(st.st_size) < offset_) offset_ = 0;  // made anew for another job
  std::string chunk(kMaxReadPerPoll, '\0');
  const ssize_t n = ::pread(fd, chunk.data(), chunk.size(), off_t(offset_));
  ::close(fd);
  if (n <= 0) return out;
  chunk.resize(size_t(n));
  size_t begin = 0;
  for (size_t nl; (nl = chunk.find('\n', begin)) != std::string::npos; begin = nl + 1) {
    ++line_;
    const std::string line = chunk.substr(begin, nl - begin);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    auto complain = [&](const char* why) {
      std::fprintf(stderr, "ballast-trainer: rank %d: %s line %llu skipped: %s\n", rank_, control_path_.c_str(),
                   (unsigned long long)line_, why);
    };
    if (!j.is_object()) {
      complain("not a JSON object");
      continue;
    }
    auto c = j.find("command");
    if (c == j.end() || !c->is_string()) {
      complain("no string \"command\"");
      continue;
    }
    auto r = j.find("rank");
    if (r != j.end() && !(r->is_number_integer() && (r->get<int64_t>() == -1 || r->get<int64_t>() == rank_))) continue;
    Command cmd;
    cmd.command = c->get<std::string>();
    if (auto s = j.find("seq"); s != j.end() && s->is_number_unsigned()) cmd.seq = s->get<uint64_t>();
    if (cmd.command == "slow") {
      auto f = j.find("factor");
      if (f == j.end() || !f->is_number() || !(f->get<double>() >= 1.0) || f->get<double>() > 1000.0) {
        complain("slow needs a number \"factor\" from 1 to 1000");
        continue;
      }
      cmd.factor = f->get<double>();
    } else if (cmd.command != "checkpoint_now" && cmd.command != "skip" && cmd.command != "stop") {
      complain(("unknown command '" + cmd.command + "'").c_str());
      continue;
    }
    out.push_back(std::move(cmd));
  }
  offset_ += begin;  // a line without its newline waits for the next boundary
  if (begin == 0 && chunk.size() == kMaxReadPerPoll) {
    std::fprintf(stderr, "ballast-trainer: rank %d: %s: a line longer than %zu bytes skipped\n", rank_,
                 control_path_.c_str(), kMaxReadPerPoll);
    offset_ += chunk.size();
  }
  return out;
}

Injections parse_injections(const std::string& spec) {
  Injections out;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    const size_t at = item.find('@');
    const std::string kind = item.substr(0, at);
    if (at == std::string::npos) throw std::runtime_error("BALLAST_INJECT: '" + item + "' has no @STEP");
    const uint64_t step = parse_step(item, item.substr(at + 1));
    if (kind == "nan")
      out.nan.insert(step);
    else if (kind == "usererror")
      out.usererror.insert(step);
    else
      throw std::runtime_error("BALLAST_INJECT: '" + item + "': unknown kind '" + kind + "' (nan, usererror)");
  }
  return out;
}

}  // namespace trainer
