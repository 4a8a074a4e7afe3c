// `ballast plan`: placement, replacement and standby sizing from the shell.
#pragma once

namespace ballast::sched {

// Run `ballast plan ARGS...` (argv[0] = "ballast plan"). Prints to
// stdout/stderr; returns 0 on success, 1 on bad input, 2 on a usage error.
int plan_command(int argc, char** argv);

}  // namespace ballast::sched
