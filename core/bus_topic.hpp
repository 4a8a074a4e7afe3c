// Topic and pattern syntax and matching (bus.hpp states the rules).
#pragma once

#include <string_view>

namespace ballast {

// Whether subscription `pattern` (valid_pattern) matches `topic`: equal,
// "*", or "p.*" for a topic that starts with "p." and is longer.
bool pattern_matches(std::string_view pattern, std::string_view topic);

}  // namespace ballast
