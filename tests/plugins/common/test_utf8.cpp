// UTF-8 validation of plugins/common, the one libballast's JSON parser and
// event printer share with the plugins: every sequence of up to 3 bytes and
// every 4-byte lead against a decoder written from the definition, and the
// offset and reason of the first invalid sequence at every alignment of the
// 8-byte ASCII path.
#include <doctest/doctest.h>

#include "utf8.hpp"

#include <cstdint>
#include <string>
#include <string_view>

using ballast::util::utf8_sequence;
using ballast::util::valid_utf8;

namespace {

// The length of the valid sequence at the start of s, or 0: decode by the
// bit patterns, then refuse what RFC 3629 refuses by value.
size_t reference(std::string_view s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  size_t len = b[0] < 0x80 ? 1 : (b[0] & 0xE0) == 0xC0 ? 2 : (b[0] & 0xF0) == 0xE0 ? 3 : (b[0] & 0xF8) == 0xF0 ? 4 : 0;
  if (len == 0 || len > s.size()) return 0;
  uint32_t cp = len == 1 ? b[0] : b[0] & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    if ((b[k] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b[k] & 0x3F);
  }
  const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < smallest[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

bool reference_valid(std::string_view s) {
  while (!s.empty()) {
    const size_t n = reference(s);
    if (n == 0) return false;
    s.remove_prefix(n);
  }
  return true;
}

// Both checks of the n bytes at b against the reference; false on the first
// disagreement.
bool agrees(const char* b, size_t n) {
  const std::string_view s(b, n);
  const char* why = nullptr;
  return utf8_sequence(b, b + n, &why) == reference(s) && valid_utf8(s) == reference_valid(s);
}

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s += char(c);
  return s;
}

}  // namespace

TEST_CASE("utf8: every 1- to 3-byte sequence, and 4-byte ones for every lead 0xF0-0xFF, agree with the definition") {
  char b[4];
  for (size_t n = 1; n <= 3; ++n) {
    for (uint32_t v = 0; v < (1u << (8 * n)); ++v) {
      for (size_t k = 0; k < n; ++k) b[k] = char(v >> (8 * k));
      if (!agrees(b, n)) {
        INFO(n, " ", v);
        REQUIRE(agrees(b, n));
      }
    }
  }
  // The fourth byte's range does not depend on the others: its two ends and
  // two bytes outside cover it.
  for (uint32_t v = 0xF00000; v < (1u << 24); ++v) {
    b[0] = char(v >> 16);
    b[1] = char(v >> 8);
    b[2] = char(v);
    for (int last : {0x80, 0xBF, 0x41, 0xC0}) {
      b[3] = char(last);
      if (!agrees(b, 4)) {
        INFO(v, " ", last);
        REQUIRE(agrees(b, 4));
      }
    }
  }
}

TEST_CASE("utf8: the first invalid sequence's offset and reason, at every alignment") {
  const std::pair<std::string, const char*> bad[] = {
      {bytes({0x80}), "a continuation byte without a lead byte"},
      {bytes({0xC0, 0xAF}), "an overlong form"},
      {bytes({0xE0, 0x80, 0xAF}), "an overlong form"},
      {bytes({0xF0, 0x80, 0x80, 0xAF}), "an overlong form"},
      {bytes({0xED, 0xA0, 0x80}), "a surrogate (U+D800 to U+DFFF) encoded in UTF-8"},
      {bytes({0xF4, 0x90, 0x80, 0x80}), "a code point above U+10FFFF"},
      {bytes({0xF7, 0xBF, 0xBF, 0xBF}), "a code point above U+10FFFF"},
      {bytes({0xFE}), "a byte never used in UTF-8"},
      {bytes({0xE2, 0x82}), "a truncated sequence"},
      {bytes({0xF0, 0x9F, 0x98, 0x41}), "a truncated sequence"},
  };
  const std::string valid = "\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF";
  CHECK(valid_utf8(valid));
  CHECK(valid_utf8(""));
  for (const auto& [sequence, reason] : bad) {
    for (size_t before = 0; before < 20; ++before) {
      INFO(reason, " after ", before);
      // ASCII before it (the 8-byte path), then ASCII or a valid tail after.
      const std::string s = std::string(before, 'a') + sequence + (before % 2 ? valid : std::string(9, 'z'));
      size_t offset = 99;
      const char* why = nullptr;
      CHECK_FALSE(valid_utf8(s, &offset, &why));
      CHECK(offset == before);
      REQUIRE(why != nullptr);
      CHECK(std::string(why) == reason);
      // After valid multi-byte text: the offset counts bytes.
      CHECK_FALSE(valid_utf8(valid + s, &offset, &why));
      CHECK(offset == valid.size() + before);
    }
  }
}
