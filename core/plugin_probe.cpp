#include "plugin_probe.hpp"

#include "error.hpp"
#include "plugin_commands.hpp"

#include <ballast/command.h>
#include <ballast/status.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace ballast {

namespace {

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// In the child: what the file is, as one JSON object.
nlohmann::json inspect(const std::string& path, bool with_commands) {
  PluginFile f;
  if (load_plugin_file(path, &f) != BALLAST_OK) return {{"error", last_error()}};
  nlohmann::json interfaces = nlohmann::json::array();
  for (const auto& i : f.interfaces) interfaces.push_back({i.name, i.version});
  nlohmann::json j = {{"path", f.path},
                      {"name", f.name},
                      {"version", f.version},
                      {"kind", f.kind},
                      {"description", f.description},
                      {"abi_major", f.abi_major},
                      {"abi_minor", f.abi_minor},
                      {"interfaces", interfaces}};
  if (with_commands && f.offers(BALLAST_COMMAND_INTERFACE, BALLAST_COMMAND_VERSION)) {
    nlohmann::json commands = nlohmann::json::array();
    std::string error;
    plugin_commands_in(f, &error, [&](void*, const ballast_command& c) {
      commands.push_back({c.name, c.summary ? c.summary : ""});
      return false;
    });
    if (!error.empty()) return {{"error", error}};
    j["commands"] = commands;
  }
  return j;
}

[[noreturn]] void child(const std::string& path, bool with_commands, int out, int timeout_ms) {
  // A crash here is reported by the parent, from the exit status.
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, SIG_DFL);
  // A plugin that blocks signals or spins is still ended by the parent's SIGKILL.
  alarm(unsigned(timeout_ms / 1000 + 2));
  const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (devnull >= 0) dup2(devnull, STDOUT_FILENO);  // a plugin's prints must not reach our output
  std::string text;
  try {
    text = inspect(path, with_commands).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const std::exception& e) {
    text = nlohmann::json{{"error", "plugin " + path + ": " + e.what()}}.dump(-1, ' ', false,
                                                                              nlohmann::json::error_handler_t::replace);
  }
  text += '\n';
  for (size_t off = 0; off < text.size();) {
    const ssize_t n = write(out, text.data() + off, text.size() - off);
    if (n <= 0) break;
    off += size_t(n);
  }
  _exit(0);
}

struct Child {
  pid_t pid = -1;
  int fd = -1;
  std::string text;
  bool eof = false;
};

void decode(const std::string& path, const std::string& text, int status, bool killed, int timeout_ms,
            PluginProbe* out) {
  out->path = path;
  if (killed) {
    out->error = "plugin " + path + " refused: did not finish loading within " + std::to_string(timeout_ms) +
                 " ms (its constructors or create() hang?)";
    return;
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    out->error = "plugin " + path + " refused: crashed with signal " + std::to_string(sig) + " (" + strsignal(sig) +
                 ") while being loaded";
    return;
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    out->error = "plugin " + path + " refused: it ended the process while being loaded (exit status " +
                 std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ", no report)";
    return;
  }
  try {
    if (j.contains("error")) {
      out->error = j["error"].get<std::string>();
      return;
    }
    PluginFile& f = out->info;
    f.path = j["path"].get<std::string>();
    f.name = j["name"].get<std::string>();
    f.version = j["version"].get<std::string>();
    f.kind = j["kind"].get<std::string>();
    f.description = j["description"].get<std::string>();
    f.abi_major = j["abi_major"].get<uint32_t>();
    f.abi_minor = j["abi_minor"].get<uint32_t>();
    for (const auto& i : j["interfaces"]) f.interfaces.push_back({i[0].get<std::string>(), i[1].get<uint32_t>()});
    if (j.contains("commands"))
      for (const auto& c : j["commands"]) out->commands.emplace_back(c[0].get<std::string>(), c[1].get<std::string>());
  } catch (const std::exception& e) {
    out->error = "plugin " + path + " refused: malformed report from its inspection: " + e.what();
  }
}

}  // namespace

int plugin_probe_timeout_ms() {
  const char* v = std::getenv("BALLAST_PLUGIN_PROBE_MS");
  const long ms = v && *v ? std::strtol(v, nullptr, 10) : 0;
  return ms > 0 && ms < 3600000 ? int(ms) : 10000;
}

std::vector<PluginProbe> probe_plugin_files(const std::vector<std::string>& files, bool with_commands) {
  const int timeout_ms = plugin_probe_timeout_ms();
  std::vector<Child> children(files.size());
  std::vector<PluginProbe> out(files.size());
  std::fflush(nullptr);  // nothing buffered is written twice
  for (size_t i = 0; i < files.size(); ++i) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
      out[i].path = files[i];
      out[i].error = "plugin " + files[i] + ": cannot inspect: " + std::strerror(errno);
      continue;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      child(files[i], with_commands, p[1], timeout_ms);
    }
    close(p[1]);
    if (pid < 0) {
      close(p[0]);
      out[i].path = files[i];
      out[i].error = "plugin " + files[i] + ": cannot inspect: fork: " + std::strerror(errno);
      continue;
    }
    children[i].pid = pid;
    children[i].fd = p[0];
  }
  const int64_t deadline = now_ms() + timeout_ms;
  while (true) {
    std::vector<pollfd> pfds;
    std::vector<size_t> which;
    for (size_t i = 0; i < children.size(); ++i)
      if (children[i].fd >= 0 && !children[i].eof) {
        pfds.push_back({children[i].fd, POLLIN, 0});
        which.push_back(i);
      }
    const int64_t left = deadline - now_ms();
    if (pfds.empty() || left <= 0) break;
    if (poll(pfds.data(), pfds.size(), int(left)) <= 0) continue;
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (!pfds[k].revents) continue;
      Child& c = children[which[k]];
      char buf[4096];
      const ssize_t n = read(c.fd, buf, sizeof buf);
      if (n > 0 && c.text.size() < (1u << 20))
        c.text.append(buf, size_t(n));
      else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
        c.eof = true;
    }
  }
  for (size_t i = 0; i < children.size(); ++i) {
    Child& c = children[i];
    if (c.pid < 0) continue;
    const bool killed = !c.eof;
    if (killed) kill(c.pid, SIGKILL);
    int status = 0;
    while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
    }
    close(c.fd);
    decode(files[i], c.text, status, killed, timeout_ms, &out[i]);
  }
  return out;
}

}  // namespace ballast
