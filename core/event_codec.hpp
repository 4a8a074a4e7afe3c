// Events as values: deep copies, JSON, and frames.
//
// OwnedEvent holds an event and everything it points to (topic, source
// strings, a well-known payload with its strings and arrays, or opaque
// bytes), so that it outlives the publisher's call. It is what queued
// delivery, the journal and `policy check` work with.
#pragma once

#include <ballast/events.h>

#include <nlohmann/json.hpp>

#include "crc32c.hpp"

#include <cstdint>
#include <memory>
#include <memory_resource>
#include <string>
#include <vector>

namespace ballast {

class OwnedEvent {
 public:
  OwnedEvent();
  // Deep copy of `event` (a well-known schema is copied field by field with
  // its strings and arrays; any other schema as payload_size opaque bytes,
  // followed by a NUL not counted in payload_size). A malformed event (NULL
  // topic, payload too small for its schema, NULL array) is copied without
  // its payload, as schema none: check before copying when that matters.
  explicit OwnedEvent(const ballast_event& event);
  OwnedEvent(const OwnedEvent& other);
  OwnedEvent& operator=(const OwnedEvent& other);
  OwnedEvent(OwnedEvent&&) noexcept;
  OwnedEvent& operator=(OwnedEvent&&) noexcept;
  ~OwnedEvent();

  // The event; its pointers stay valid while this object lives and is not
  // modified.
  const ballast_event& view() const;

 private:
  struct Storage;
  std::unique_ptr<Storage> s_;
  friend class EventBuilder;
};

// {"topic":..., "ts": seconds (double), "ts_ns": int, "source": {"node","rank","plugin"},
//  "schema": "metric_batch"|..., "payload": {...}} -- well-known payloads as
// objects with their fields by name, JSON payloads parsed, opaque bytes as
// {"bytes_hex": "..."}.
nlohmann::json event_to_json(const ballast_event& event);

// The reverse of event_to_json: "topic" required; "ts" (seconds) or "ts_ns"
// optional (0 = now at publish); "payload" optional. The schema is taken from
// "schema" if present, else from the topic's well-known schema (topic ->
// schema table below), else JSON. Returns a status; on failure *error names
// the field ("payload.samples[3].value: expected a number").
int event_from_json(const nlohmann::json& json, OwnedEvent* out, std::string* error);

// The well-known schema of a topic (metric.sample -> METRIC_BATCH, ...), or
// BALLAST_SCHEMA_JSON for any other topic.
uint32_t schema_for_topic(const char* topic);
// "metric_batch", "json", ..., or "custom".
const char* schema_name(uint32_t schema);

// Frame codec for the journal and for crossing processes. A frame is
//   magic "BLF1" (4 bytes) | format version u16 | flags u16 | body length u32 |
//   CRC-32C of the body u32 | body (the event as a cereal portable binary archive)
// decode_frame never trusts the input: a bad magic, an unknown version, a
// length past the end or above max_body, or a checksum mismatch is an error.
inline constexpr uint16_t kFrameVersion = 1;
inline constexpr size_t kFrameHeaderSize = 16;
inline constexpr uint32_t kMaxFrameBody = 64u << 20;

// Appends one frame to *out. A malformed event (see OwnedEvent) is framed
// without its payload, with schema none.
void encode_frame(const ballast_event& event, std::vector<unsigned char>* out);
// Decode one frame at the start of [data, data+size). On success *consumed is
// the frame's total size. Errors: BALLAST_EFORMAT with *error saying why.
int decode_frame(const unsigned char* data, size_t size, OwnedEvent* out, size_t* consumed, std::string* error);
// The same, without the copy into an OwnedEvent: *out's strings, arrays and
// payload are allocated from `memory` (and point nowhere else), valid while
// that memory is. For a caller that decodes many frames and releases them
// together (the cluster controller's batches).
int decode_frame_into(const unsigned char* data, size_t size, std::pmr::memory_resource* memory, ballast_event* out,
                      size_t* consumed, std::string* error);

// The frames' checksum: CRC-32C, the one implementation plugins use too
// (plugins/common, linked into libballast).
using util::crc32c;

}  // namespace ballast
