// The built-in subcommands of `ballast`, one file each.
#pragma once

#include <CLI/CLI.hpp>

namespace ballast::cli {

void add_run(CLI::App& app);      // ballast run CONFIG.lua
void add_plugins(CLI::App& app);  // ballast plugins [DIR|FILE...]
void add_policy(CLI::App& app);   // ballast policy check SCRIPT.lua [--events FILE]
void add_journal(CLI::App& app);  // ballast journal cat FILE

// Library signal handlers stay out (UCX's would decide how a command dies,
// and deadlocks in malloc inside its backtrace); a crash instead prints the
// signal and the plugin whose code was on the stack, then dies of it.
void install_crash_report();

// The exit code set by the subcommand that ran (0 by default).
int exit_code();
void set_exit_code(int code);

}  // namespace ballast::cli
