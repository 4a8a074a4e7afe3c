// `ballast suspects --events FILE|- [--json]`: replay recorded events (JSON
// lines, as `ballast journal cat FILE --json` prints a journal) through the
// fusion and print the job's ranked suspects.
#pragma once

namespace ballast::fusion {

// Exit 0 on success, 1 on bad input (FILE:LINE named), 2 on a usage error.
int suspects_main(int argc, char** argv);

}  // namespace ballast::fusion
