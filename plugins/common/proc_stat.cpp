#include "proc_stat.hpp"

#include <charconv>
#include <cstdio>
#include <memory>

namespace ballast::util {

bool parse_proc_stat(std::string_view text, ProcStat* out) {
  const size_t close = text.rfind(')');
  if (close == std::string_view::npos || text.find('(') > close) return false;
  std::string_view rest = text.substr(close + 1);
  // Fields after the command, numbered as proc(5) numbers them: state is 3.
  ProcStat s;
  for (int field = 3; field <= 24; ++field) {
    const size_t begin = rest.find_first_not_of(' ');
    if (begin == std::string_view::npos) return false;
    rest.remove_prefix(begin);
    const size_t end = std::min(rest.find_first_of(" \n"), rest.size());
    const std::string_view token = rest.substr(0, end);
    rest.remove_prefix(end);
    if (field == 3) {
      if (token.size() != 1) return false;
      s.state = token[0];
      continue;
    }
    uint64_t* target = field == 14   ? &s.utime
                       : field == 15 ? &s.stime
                       : field == 22 ? &s.start_time
                       : field == 24 ? &s.rss_pages
                                     : nullptr;
    if (target == nullptr) continue;
    const auto [p, ec] = std::from_chars(token.data(), token.data() + token.size(), *target);
    if (ec != std::errc() || p != token.data() + token.size()) return false;
  }
  *out = s;
  return true;
}

bool read_proc_stat(int pid, ProcStat* out, const std::string& proc_root) {
  const std::string path = proc_root + "/" + std::to_string(pid) + "/stat";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "r"), &std::fclose);
  if (!f) return false;
  // One line, a few hundred bytes; the command name is at most 64 bytes.
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf, f.get());
  return parse_proc_stat(std::string_view(buf, n), out);
}

}  // namespace ballast::util
