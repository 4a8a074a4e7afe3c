// One process's /proc/PID/stat (proc(5)): the fields Ballast reads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ballast::util {

struct ProcStat {
  char state = 0;           // R running, S sleeping, D disk wait, T/t stopped, Z zombie, X dead, ...
  uint64_t utime = 0;       // user CPU time, clock ticks (sysconf(_SC_CLK_TCK))
  uint64_t stime = 0;       // system CPU time, clock ticks
  uint64_t start_time = 0;  // clock ticks after boot: with the pid, names one process
  uint64_t rss_pages = 0;   // resident set, pages
};

// Parses the text of /proc/PID/stat: false when it is not one. The command
// name may hold spaces and parentheses: the last ')' ends it.
bool parse_proc_stat(std::string_view text, ProcStat* out);

// Reads PROC_ROOT/PID/stat (proc_root is "/proc" but for tests): false when
// the process is gone or the file is not one.
bool read_proc_stat(int pid, ProcStat* out, const std::string& proc_root = "/proc");

}  // namespace ballast::util
