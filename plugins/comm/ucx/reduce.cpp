#include "reduce.hpp"

#include <cmath>
#include <cstring>

namespace ballast::comm {

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to infinity
  if (abs < 0x38800000u) {                                  // subnormal or zero in half
    if (abs < 0x33000000u) return sign;
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24: half subnormals count units of 2^-24
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t v = mant >> shift;
    if (rem > halfway || (rem == halfway && (v & 1u))) ++v;
    return uint16_t(sign | v);
  }
  uint32_t v = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (v & 1u))) ++v;
  return uint16_t(sign | v);
}

float bf16_to_float(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

namespace {

template <class T>
T combine(T a, T b, uint32_t redop) {
  switch (redop) {
    case BALLAST_RED_SUM:
      return T(a + b);
    case BALLAST_RED_PROD:
      return T(a * b);
    case BALLAST_RED_MIN:
      return b < a ? b : a;
    default:
      return a < b ? b : a;
  }
}

// The switch on redop sits outside the loop so that the compiler vectorises each.
template <class T>
void reduce_typed(char* dst, const char* a, const char* b, std::size_t n, uint32_t redop) {
  T* d = reinterpret_cast<T*>(dst);
  const T* x = reinterpret_cast<const T*>(a);
  const T* y = reinterpret_cast<const T*>(b);
  switch (redop) {
    case BALLAST_RED_SUM:
      for (std::size_t i = 0; i < n; ++i) d[i] = T(x[i] + y[i]);
      break;
    case BALLAST_RED_PROD:
      for (std::size_t i = 0; i < n; ++i) d[i] = T(x[i] * y[i]);
      break;
    case BALLAST_RED_MIN:
      for (std::size_t i = 0; i < n; ++i) d[i] = y[i] < x[i] ? y[i] : x[i];
      break;
    default:
      for (std::size_t i = 0; i < n; ++i) d[i] = x[i] < y[i] ? y[i] : x[i];
      break;
  }
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void reduce_half(char* dst, const char* a, const char* b, std::size_t n, uint32_t redop) {
  for (std::size_t i = 0; i < n; ++i) {
    uint16_t x, y;
    std::memcpy(&x, a + 2 * i, 2);
    std::memcpy(&y, b + 2 * i, 2);
    const uint16_t r = Store(combine(Load(x), Load(y), redop));
    std::memcpy(dst + 2 * i, &r, 2);
  }
}

}  // namespace

void reduce_into(void* dst, const void* src, std::size_t count, uint32_t dtype, uint32_t redop) {
  reduce_to(dst, dst, src, count, dtype, redop);
}

void reduce_to(void* dst, const void* a, const void* b, std::size_t count, uint32_t dtype, uint32_t redop) {
  char* d = static_cast<char*>(dst);
  const char* x = static_cast<const char*>(a);
  const char* s = static_cast<const char*>(b);
  switch (dtype) {
    case BALLAST_DT_F32:
      reduce_typed<float>(d, x, s, count, redop);
      break;
    case BALLAST_DT_F64:
      reduce_typed<double>(d, x, s, count, redop);
      break;
    case BALLAST_DT_I32: {
      // Sum and product wrap like two's complement instead of being undefined.
      if (redop == BALLAST_RED_SUM || redop == BALLAST_RED_PROD)
        reduce_typed<uint32_t>(d, x, s, count, redop);
      else
        reduce_typed<int32_t>(d, x, s, count, redop);
      break;
    }
    case BALLAST_DT_I64: {
      if (redop == BALLAST_RED_SUM || redop == BALLAST_RED_PROD)
        reduce_typed<uint64_t>(d, x, s, count, redop);
      else
        reduce_typed<int64_t>(d, x, s, count, redop);
      break;
    }
    case BALLAST_DT_U8:
      reduce_typed<uint8_t>(d, x, s, count, redop);
      break;
    case BALLAST_DT_F16:
      reduce_half<half_to_float, float_to_half>(d, x, s, count, redop);
      break;
    case BALLAST_DT_BF16:
      reduce_half<bf16_to_float, float_to_bf16>(d, x, s, count, redop);
      break;
    default:
      break;
  }
}

}  // namespace ballast::comm
