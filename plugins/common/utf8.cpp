#include "utf8.hpp"

#include <cstdint>
#include <cstring>

namespace ballast::util {

size_t utf8_sequence(const char* p, const char* end, const char** why) {
  const auto* s = reinterpret_cast<const unsigned char*>(p);
  const size_t avail = size_t(end - p);
  const unsigned char c = s[0];
  if (c < 0x80) return 1;
  // The second byte's range depends on the first (RFC 3629, section 4): it
  // is what rules out overlong forms, surrogates and code points past U+10FFFF.
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c < 0xC0) {
    *why = "a continuation byte without a lead byte";
    return 0;
  } else if (c < 0xC2) {
    *why = "an overlong form";
    return 0;
  } else if (c < 0xE0) {
    len = 2;
  } else if (c < 0xF0) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c < 0xF5) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *why = c < 0xF8 ? "a code point above U+10FFFF" : "a byte never used in UTF-8";
    return 0;
  }
  if (avail < 2 || (s[1] & 0xC0) != 0x80) {
    *why = "a truncated sequence";
    return 0;
  }
  if (s[1] < lo) {
    *why = "an overlong form";
    return 0;
  }
  if (s[1] > hi) {
    *why = c == 0xED ? "a surrogate (U+D800 to U+DFFF) encoded in UTF-8" : "a code point above U+10FFFF";
    return 0;
  }
  for (size_t k = 2; k < len; ++k) {
    if (k >= avail || (s[k] & 0xC0) != 0x80) {
      *why = "a truncated sequence";
      return 0;
    }
  }
  return len;
}

bool valid_utf8(std::string_view s, size_t* offset, const char** why) {
  const char* p = s.data();
  const char* end = p + s.size();
  const char* reason = nullptr;
  while (p < end) {
    // ASCII 8 bytes at a time: no byte with its high bit set.
    if (end - p >= 8) {
      uint64_t word;
      std::memcpy(&word, p, 8);
      if ((word & 0x8080808080808080u) == 0) {
        p += 8;
        continue;
      }
    }
    size_t n = utf8_sequence(p, end, &reason);
    if (n == 0) {
      if (offset != nullptr) *offset = size_t(p - s.data());
      if (why != nullptr) *why = reason;
      return false;
    }
    p += n;
  }
  return true;
}

}  // namespace ballast::util
