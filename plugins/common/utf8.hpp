// UTF-8 validation for text read from files, configs and events: it ends up
// in JSON writers and Lua policies, which must see nothing else.
#pragma once

#include <cstddef>
#include <string_view>

namespace ballast::util {

// The length (1 to 4) of the valid UTF-8 sequence that starts at p (p <
// end), or 0 with *why set to what is wrong with it: an unexpected
// continuation byte, an overlong form, a surrogate, a code point above
// U+10FFFF, a truncated sequence. Meant for a byte of 0x80 or more; callers
// skip ASCII themselves.
size_t utf8_sequence(const char* p, const char* end, const char** why);

// Whether s is valid UTF-8. When it is not, *offset (if given) is where the
// first invalid sequence starts and *why (if given) what is wrong with it.
bool valid_utf8(std::string_view s, size_t* offset = nullptr, const char** why = nullptr);

}  // namespace ballast::util
