// The thread-local last-error message behind ballast_last_error() and
// ballast_host_api.last_error (DESIGN.md, ABI rule 4).
#pragma once

#include <string>

namespace ballast {

// Record `message` as this thread's last error and return `status`, so that
// a failure is reported in one line: `return fail(BALLAST_EINVAL, "...")`.
int fail(int status, std::string message);

// This thread's last error message, "" if none.
const char* last_error();

// Forget this thread's last error.
void clear_error();

}  // namespace ballast
