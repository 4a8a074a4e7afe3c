// A bound on how deep JSON text may nest, checked before it is parsed:
// nlohmann::json parses any depth, but copying, comparing and printing a
// value recurse, so 100,000 `[` in a file would overflow the stack there.
#pragma once

#include <cstddef>
#include <string_view>

namespace ballast {

inline constexpr size_t kMaxJsonDepth = 128;

// Whether `text`'s arrays and objects nest at most `limit` deep (brackets
// inside strings do not count). A scan without recursion or allocation.
bool json_depth_within(std::string_view text, size_t limit = kMaxJsonDepth);

}  // namespace ballast
