// Element-wise reductions over the dtypes of comm.h. f16 and bf16 are
// widened to float, combined, and rounded back to nearest even.
#pragma once

#include <ballast/comm.h>

#include <cstddef>
#include <cstdint>

namespace ballast::comm {

// dst[i] = dst[i] op src[i] for i < count. Buffers may be unaligned.
void reduce_into(void* dst, const void* src, std::size_t count, uint32_t dtype, uint32_t redop);
// dst[i] = a[i] op b[i]; dst may be a (not b unless it is a too).
void reduce_to(void* dst, const void* a, const void* b, std::size_t count, uint32_t dtype, uint32_t redop);

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);

}  // namespace ballast::comm
