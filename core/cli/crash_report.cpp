#include "commands.hpp"

#include "plugin_loader.hpp"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace ballast::cli {

namespace {

void write_str(const char* s) {
  if (write(STDERR_FILENO, s, std::strlen(s)) < 0) return;
}

// Async-signal-safe: fixed buffers, write(2), the loader's range table.
void on_crash(int sig, siginfo_t* info, void*) {
  write_str("ballast: crashed with ");
  const char* name = sigabbrev_np(sig);
  write_str(name ? "SIG" : "a signal");
  if (name) write_str(name);
  void* frames[64];
  const int n = backtrace(frames, 64);  // libgcc loaded at install time
  const char* plugin = nullptr;
  for (int i = 0; i < n && plugin == nullptr; ++i) plugin = plugin_containing(reinterpret_cast<uintptr_t>(frames[i]));
  if (plugin == nullptr && info != nullptr) plugin = plugin_containing(reinterpret_cast<uintptr_t>(info->si_addr));
  if (plugin != nullptr) {
    write_str(" in plugin ");
    write_str(plugin);
  }
  write_str("\n");
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void install_crash_report() {
  // UCX installs handlers for these signals when it loads (with a UCX
  // plugin): unless the user asked for them, it leaves them alone.
  setenv("UCX_HANDLE_ERRORS", "none", 0);
  setenv("UCX_ERROR_SIGNALS", "", 0);
  void* warm[1];
  backtrace(warm, 1);
  static char stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = stack;
  ss.ss_size = sizeof stack;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_crash;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &sa, nullptr);
}

}  // namespace ballast::cli
