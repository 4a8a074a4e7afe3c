// UTF-8 validation for text read from files and configs: it ends up in
// JSON writers and events, which refuse anything else.
#pragma once

#include <string>

namespace ballast::util {

// Whether s is valid UTF-8 (no overlong forms, surrogates or code points
// above U+10FFFF).
bool valid_utf8(const std::string& s);

}  // namespace ballast::util
