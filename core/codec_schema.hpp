// Field tables of the well-known payloads of abi/ballast/events.h.
//
// One table per struct drives everything that walks a payload: the check and
// the deep copy (codec_flat), JSON in both directions, the cereal frame body
// and the topic -> schema map (event_codec.cpp), and the Lua tables of
// policies (lua_event.cpp). A field added to events.h is added here once.
#pragma once

#include <ballast/events.h>

#include <cstddef>
#include <cstdint>

namespace ballast::codec {

enum class FieldType : uint8_t {
  size,   // uint32_t size of the struct: not serialised, set to sizeof on copy
  count,  // uint32_t element count of the struct's array: derived from the array
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
  const StructDesc* elem = nullptr;  // array: the element
  uint32_t count_offset = 0;         // array: where its count lives
};

struct StructDesc {
  const char* name;
  uint32_t size;  // sizeof as this host compiled it
  uint32_t align;
  const FieldDesc* fields;
  uint32_t field_count;
  uint32_t v1_size = 0;                 // BALLAST_*_V1_SIZE; element structs: size
  uint32_t schema = 0;                  // its schema id; 0 for element structs
  const char* const* topics = nullptr;  // the topics that carry it (schema_for_topic)
  uint32_t topic_count = 0;
};

// The struct behind a well-known schema id, or nullptr (NONE, JSON, custom).
const StructDesc* struct_for_schema(uint32_t schema);

// Every well-known struct, in schema order.
const StructDesc* const* well_known_structs(uint32_t* count);

// The largest well-known struct (codec_flat's zero-padded copies).
inline constexpr uint32_t kMaxStructSize = 256;

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
