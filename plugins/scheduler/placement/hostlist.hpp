// Slurm hostlist expressions: "gpu[001-096,120]", "r[1-2]n[01-04]", "a,b[1-3]".
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

namespace ballast::sched {

// A malformed input or an impossible request. what() starts with where it
// is when there is a where ("topology.conf:12: ...", "job.json: field ...").
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Expand a hostlist into names, in the order written. Zero padding follows
// the width of each range's first bound ("001-010" gives 001..010). Throws
// InputError (message without a location: callers prefix it) on unbalanced
// or nested brackets, empty or reversed ranges, non-digits in a range, or an
// expansion of more than kMaxHostlistNames names.
std::vector<std::string> expand_hostlist(const std::string& expr);

// The most names one input (a file, a request) may expand to, all its
// hostlists together: a few bytes of hostlist must not cost gigabytes. The
// fuzz targets build with a smaller bound: a million names cost seconds
// under ASan, and the fuzzer is there to explore the parser, not the scale.
#ifndef BALLAST_MAX_HOSTLIST_NAMES
#define BALLAST_MAX_HOSTLIST_NAMES 1000000
#endif
inline constexpr size_t kMaxHostlistNames = BALLAST_MAX_HOSTLIST_NAMES;

// The same, counting against *budget (names left for the whole input) and
// taking the names from it; throws once it would go below zero.
std::vector<std::string> expand_hostlist(const std::string& expr, size_t* budget);

// Fold a list of names into a hostlist: consecutive numbers after the same
// prefix become ranges ("gpu[001-003,007]"), each range printed at the width
// of its first number; prefixes in order of first appearance, names without
// a number kept as they are. expand_hostlist() gives the same names back,
// grouped by prefix.
std::string compress_hostlist(const std::vector<std::string>& names);

}  // namespace ballast::sched
