#include "crc32c.hpp"

#include <array>
#include <cstring>

namespace ballast::util {

namespace {

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t crc_soft(uint32_t crc, const uint8_t* p, size_t n) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return crc;
}

// Appending n zero bytes to a message is a linear map on its CRC: a 32x32
// matrix over GF(2), built by repeated squaring of the one-zero-bit map.
// shift(len) o crc(A) ^ crc(B) = crc(A || B) when len = |B|.
struct Gf2Matrix {
  uint32_t col[32];
};

uint32_t gf2_times(const Gf2Matrix& m, uint32_t v) {
  uint32_t out = 0;
  for (int i = 0; v != 0; ++i, v >>= 1)
    if (v & 1) out ^= m.col[i];
  return out;
}

Gf2Matrix gf2_square(const Gf2Matrix& m) {
  Gf2Matrix out{};
  for (int i = 0; i < 32; ++i) out.col[i] = gf2_times(m, m.col[i]);
  return out;
}

Gf2Matrix gf2_multiply(const Gf2Matrix& a, const Gf2Matrix& b) {  // a after b
  Gf2Matrix out{};
  for (int i = 0; i < 32; ++i) out.col[i] = gf2_times(a, b.col[i]);
  return out;
}

Gf2Matrix zeros_operator(uint64_t bytes) {
  Gf2Matrix bit{};  // one zero bit
  bit.col[0] = 0x82F63B78u;
  for (int i = 1; i < 32; ++i) bit.col[i] = 1u << (i - 1);
  Gf2Matrix power = gf2_square(gf2_square(gf2_square(bit)));  // one zero byte
  Gf2Matrix result{};
  for (int i = 0; i < 32; ++i) result.col[i] = 1u << i;  // identity
  for (; bytes != 0; bytes >>= 1) {
    if (bytes & 1) result = gf2_multiply(power, result);
    power = gf2_square(power);
  }
  return result;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_hw(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}

// The crc32 instruction has a latency of three cycles and a throughput of
// one: three independent lanes run about three times faster, and their CRCs
// are joined with the zero-append operator (cached for the last lane length).
__attribute__((target("sse4.2"))) uint32_t crc_hw3(uint32_t state, const uint8_t* p, size_t n) {
  const size_t lane = (n / 3) & ~size_t(7);
  uint64_t c0 = state, c1 = 0xFFFFFFFFu, c2 = 0xFFFFFFFFu;
  const uint8_t* p1 = p + lane;
  const uint8_t* p2 = p + 2 * lane;
  for (size_t i = 0; i < lane; i += 8) {
    uint64_t v0, v1, v2;
    std::memcpy(&v0, p + i, 8);
    std::memcpy(&v1, p1 + i, 8);
    std::memcpy(&v2, p2 + i, 8);
    c0 = __builtin_ia32_crc32di(c0, v0);
    c1 = __builtin_ia32_crc32di(c1, v1);
    c2 = __builtin_ia32_crc32di(c2, v2);
  }
  thread_local size_t cached_lane = 0;
  thread_local Gf2Matrix shift{};
  if (cached_lane != lane) {
    shift = zeros_operator(lane);
    cached_lane = lane;
  }
  // Finalised CRCs of the three lanes, joined, then back to a running state.
  uint32_t f = ~uint32_t(c0);
  f = gf2_times(shift, f) ^ ~uint32_t(c1);
  f = gf2_times(shift, f) ^ ~uint32_t(c2);
  return crc_hw(~f, p + 3 * lane, n - 3 * lane);
}
#endif

}  // namespace

uint32_t crc32c_update(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hw = __builtin_cpu_supports("sse4.2");
  if (!hw)
    crc = crc_soft(crc, p, size);
  else
    crc = size >= 3 * 4096 ? crc_hw3(crc, p, size) : crc_hw(crc, p, size);
#else
  crc = crc_soft(crc, p, size);
#endif
  return ~crc;
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return gf2_times(zeros_operator(length_b), crc_a) ^ crc_b;
}

}  // namespace ballast::util
