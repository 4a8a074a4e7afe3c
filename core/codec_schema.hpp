// Field tables of the well-known payloads of abi/ballast/events.h.
//
// One table per struct drives everything that walks a payload: the deep copy
// (codec_flat), JSON in both directions and the cereal frame body
// (event_codec.cpp). A field added to events.h is added here once.
#pragma once

#include <ballast/events.h>

#include <cstddef>
#include <cstdint>

namespace ballast::codec {

enum class FieldType : uint8_t {
  size,      // uint32_t size of the struct: not serialised, set to sizeof on copy
  count,     // uint32_t element count of the struct's array: derived from the array
  u32,
  i32,
  u64,
  i64,
  f64,
  str,       // const char*, NULL allowed
  json_str,  // const char* holding JSON text: an object in JSON when it parses
  array      // const T* with `count` elements described by `elem`
};

struct StructDesc;

struct FieldDesc {
  const char* name;
  FieldType type;
  uint32_t offset;
  int64_t missing = 0;                 // value when absent from JSON
  const char* const* names = nullptr;  // u32 enums: value -> name, shown in JSON
  uint32_t name_count = 0;
  const StructDesc* elem = nullptr;    // array: the element
  uint32_t count_offset = 0;           // array: where its count lives
};

struct StructDesc {
  const char* name;
  uint32_t size;
  uint32_t align;
  const FieldDesc* fields;
  uint32_t field_count;
};

// The struct behind a well-known schema id, or nullptr (NONE, JSON, custom).
const StructDesc* struct_for_schema(uint32_t schema);

// Typed access to a field of a struct at `base`.
template <typename T>
inline T& field_ref(void* base, const FieldDesc& f) {
  return *reinterpret_cast<T*>(static_cast<unsigned char*>(base) + f.offset);
}
template <typename T>
inline const T& field_ref(const void* base, const FieldDesc& f) {
  return *reinterpret_cast<const T*>(static_cast<const unsigned char*>(base) + f.offset);
}

}  // namespace ballast::codec
