// Flattened deep copies of events.
//
// A deep copy of an event is laid out in one contiguous, 8-byte aligned
// buffer: the payload struct, its arrays, then every string (topic, source,
// payload strings), with the copy's pointers pointing into the buffer. One
// buffer instead of one allocation per string is what lets a queue slot
// hold a copy in a preallocated inline buffer (no allocation per event), and
// lets OwnedEvent cost one allocation.
#pragma once

#include "codec_schema.hpp"

#include <ballast/event.h>

#include <cstddef>

namespace ballast::codec {

inline constexpr size_t kFlatAlign = 8;

// Whether `event` is well formed enough to be read or copied: a size of at
// least BALLAST_EVENT_V1_SIZE, a topic, a payload pointer when payload_size >
// 0, and for a well-known schema a payload whose size field and payload_size
// are both at least the struct's v1 minimum (status.h, "Sizes") and whose
// arrays are non-NULL when their count is not 0. On failure *why (static
// text) says what is wrong.
bool check_event(const ballast_event& event, const char** why);

// The payload of a checked event of a well-known schema as a whole struct of
// this host's layout: the payload itself when it is at least that large,
// else a copy in `scratch` with the fields it leaves out zeroed (their
// default). Every reader of payloads goes through this: the size rule of
// the ABI is applied here once.
struct PayloadScratch {
  alignas(16) unsigned char bytes[kMaxStructSize];
};
const void* whole_payload(const ballast_event& checked, PayloadScratch* scratch);

// Bytes a flattened copy of a checked event needs. `stable_topic`, when
// given, is a string equal to event.topic that outlives every copy (the
// bus's interned topic name): copies point at it instead of copying it.
size_t flat_size(const ballast_event& event, const char* stable_topic = nullptr);

// Copy a checked `event` into `buf` (kFlatAlign-aligned, flat_size bytes)
// and point *out at the copy. A well-known payload is copied as its v1
// struct (size fields set to sizeof); any other payload as payload_size
// bytes followed by a NUL (not counted in payload_size), so that JSON text
// can be read as a C string.
void flatten(const ballast_event& event, unsigned char* buf, ballast_event* out, const char* stable_topic = nullptr);

// flatten() into a buffer of `cap` bytes when the copy fits (true); else
// nothing usable is written and false is returned. Either way *needed is
// flat_size(): one pass over the event in the common case.
bool flatten_into(const ballast_event& event, unsigned char* buf, size_t cap, ballast_event* out, size_t* needed,
                  const char* stable_topic = nullptr);

// Copy a flattened event whose buffer starts at `from` (`bytes` long) to
// `to` and point *out at the copy: a memcpy and a pointer shift, cheaper
// than flattening again when one event goes to several queues.
void copy_flat(const ballast_event& flat, const unsigned char* from, size_t bytes, unsigned char* to,
               ballast_event* out);

}  // namespace ballast::codec
