// CRC-32C of plugins/common, the one libballast's journal frames and the
// start-up plugin's checksums share: known values, every path (table,
// instruction, three lanes) agreeing, and the combination of two CRCs.
#include <doctest/doctest.h>

#include "crc32c.hpp"

#include <cstring>
#include <random>
#include <string>
#include <vector>

using ballast::util::crc32c;
using ballast::util::crc32c_combine;
using ballast::util::crc32c_update;

namespace {

// Bit by bit, as the definition says (reflected polynomial 0x82F63B78).
uint32_t reference(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

}  // namespace

TEST_CASE("crc32c: the published check value and the empty input") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);  // RFC 3720, the CRC catalogue's check
  CHECK(crc32c("", 0) == 0u);
  const std::vector<unsigned char> zeros(32, 0);
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
}

TEST_CASE("crc32c: every length and alignment agrees with the definition, the three-lane path included") {
  std::mt19937 rng(31);
  std::vector<unsigned char> data(3 * 4096 * 3 + 17);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(4095), size_t(3 * 4096 - 1),
                   size_t(3 * 4096), size_t(3 * 4096 + 5), data.size() - 3})
    for (size_t offset : {0, 1, 3}) {
      CAPTURE(n);
      CAPTURE(offset);
      CHECK(crc32c(data.data() + offset, n) == reference(data.data() + offset, n));
    }
}

TEST_CASE("crc32c: chained updates and the combination of two CRCs equal the CRC of the whole") {
  std::string a(5000, 'a'), b = "a second part, of another length";
  for (size_t i = 0; i < a.size(); ++i) a[i] = char(i * 7);
  const std::string whole = a + b;
  const uint32_t full = crc32c(whole.data(), whole.size());
  CHECK(crc32c_update(crc32c(a.data(), a.size()), b.data(), b.size()) == full);
  CHECK(crc32c_combine(crc32c(a.data(), a.size()), crc32c(b.data(), b.size()), b.size()) == full);
  CHECK(crc32c_combine(full, crc32c("", 0), 0) == full);
}
