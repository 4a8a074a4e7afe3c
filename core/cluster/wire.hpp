// The messages of the cluster link (agent <-> controller), carried inside TLS.
//
//   magic "BLC1" (4) | type u16 | reserved u16 | body length u32 | number u64 | body
//
// `number` is the message's sequence number, acknowledgement or time (see
// MsgType); an event travels as one frame of core/event_codec in the body.
// Decoding never trusts its input: a bad magic, an unknown type or a body
// above kMaxMessageBody is an error that closes the link.
#pragma once

#include "event_codec.hpp"

#include <ballast/event.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ballast::cluster {

enum class MsgType : uint16_t {
  hello = 1,       // agent -> controller: body JSON {"node","overflow"}; number 0
  welcome = 2,     // controller -> agent: number = the last sequence applied from this node
  refuse = 3,      // controller -> agent: body = why (not the leader, wrong node name); then close
  event = 4,       // agent -> controller: number = sequence; body = event frame
  ack = 5,         // controller -> agent: number = every sequence up to it is applied
  heartbeat = 6,   // both ways: number = sender's wall clock, ns
  action = 7,      // controller -> agent: number = action id (per node); body = event frame
  action_ack = 8,  // agent -> controller: number = action id carried out (or already)
};

inline constexpr size_t kMessageHeaderSize = 20;
inline constexpr uint32_t kMaxMessageBody = kMaxFrameBody + kFrameHeaderSize;

struct Message {
  MsgType type;
  uint64_t number;
  const unsigned char* body;
  size_t body_size;
};

// Append one message to *out.
void encode_message(MsgType type, uint64_t number, const void* body, size_t body_size, std::vector<unsigned char>* out);

// Decode the message at the start of [data, data+size): 1 with *m and
// *consumed set, 0 when more bytes are needed, -1 on malformed input (*error
// says why). m->body points into data.
int decode_message(const unsigned char* data, size_t size, Message* m, size_t* consumed, std::string* error);

// Spooled and ingested events are journaled (core/journal) wrapped in an
// event of this schema, topic "cluster.event", source.node = the agent's
// node; payload = sequence u64 (little endian) | the event's frame.
inline constexpr uint32_t kSchemaSpooled = BALLAST_SCHEMA_CUSTOM + 0x2600;
inline constexpr const char* kSpooledTopic = "cluster.event";

struct Spooled {
  std::string node;
  uint64_t seq = 0;
  std::vector<unsigned char> frame;
};

// The wrapper of (node, seq, frame); payload is scratch that must outlive the
// returned event.
ballast_event wrap_spooled(const char* node, uint64_t seq, const unsigned char* frame, size_t frame_size,
                           std::vector<unsigned char>* payload);
// Unwrap; false when `event` is not a well-formed wrapper.
bool unwrap_spooled(const ballast_event& event, Spooled* out);

// "host:port" -> host and port; false with *error on a bad address.
bool split_host_port(const std::string& address, std::string* host, uint16_t* port, std::string* error);

}  // namespace ballast::cluster
