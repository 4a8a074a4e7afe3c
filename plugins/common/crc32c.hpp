// CRC-32C (Castagnoli), as iSCSI, ext4 and the journal frames use it: the
// SSE 4.2 instruction where the CPU has it (three lanes in parallel for large
// buffers), a table otherwise. One implementation for libballast (journal
// frames) and the plugins (start-up checksums of checkpoints).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ballast::util {

// crc32c_update(0, ...) starts a new checksum; chain calls to extend it.
// Thread-safe.
uint32_t crc32c_update(uint32_t crc, const void* data, size_t size);
inline uint32_t crc32c(const void* data, size_t size) { return crc32c_update(0, data, size); }

// crc32c(A || B) from crc32c(A), crc32c(B) and the length of B.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

}  // namespace ballast::util
