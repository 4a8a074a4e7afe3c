// `ballast whatif`: the what-if analysis of a trace file.
#pragma once

#include <cstdio>

namespace ballast::straggler {

// Runs `ballast whatif --trace FILE [--meta FILE] [--json] [--timeline FILE]`
// (argv[0] is the command's name). Writes the report to out, errors to err;
// returns the exit code: 0 success, 1 failure, 2 usage error.
int run_whatif(int argc, char** argv, std::FILE* out, std::FILE* err);

}  // namespace ballast::straggler
