#include "wire.hpp"

#include <cstring>

namespace ballast::cluster {

namespace {

constexpr unsigned char kMagic[4] = {'B', 'L', 'C', '1'};

void put_le(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

void encode_message(MsgType type, uint64_t number, const void* body, size_t body_size,
                    std::vector<unsigned char>* out) {
  size_t at = out->size();
  out->resize(at + kMessageHeaderSize + body_size);
  unsigned char* p = out->data() + at;
  std::memcpy(p, kMagic, 4);
  put_le(p + 4, static_cast<uint16_t>(type), 2);
  put_le(p + 6, 0, 2);
  put_le(p + 8, body_size, 4);
  put_le(p + 12, number, 8);
  if (body_size > 0) std::memcpy(p + kMessageHeaderSize, body, body_size);
}

int decode_message(const unsigned char* data, size_t size, Message* m, size_t* consumed, std::string* error) {
  if (size < 4) return 0;
  if (std::memcmp(data, kMagic, 4) != 0) {
    *error = "bad message magic";
    return -1;
  }
  if (size < kMessageHeaderSize) return 0;
  uint64_t type = get_le(data + 4, 2);
  if (type < static_cast<uint16_t>(MsgType::hello) || type > static_cast<uint16_t>(MsgType::action_ack)) {
    *error = "unknown message type " + std::to_string(type);
    return -1;
  }
  uint64_t length = get_le(data + 8, 4);
  if (length > kMaxMessageBody) {
    *error = "message body of " + std::to_string(length) + " bytes is above the limit";
    return -1;
  }
  if (size < kMessageHeaderSize + length) return 0;
  m->type = static_cast<MsgType>(type);
  m->number = get_le(data + 12, 8);
  m->body = data + kMessageHeaderSize;
  m->body_size = length;
  *consumed = kMessageHeaderSize + length;
  return 1;
}

ballast_event wrap_spooled(const char* node, uint64_t seq, const unsigned char* frame, size_t frame_size,
                           std::vector<unsigned char>* payload) {
  payload->resize(8 + frame_size);
  put_le(payload->data(), seq, 8);
  if (frame_size > 0) std::memcpy(payload->data() + 8, frame, frame_size);
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = kSchemaSpooled;
  ev.topic = kSpooledTopic;
  ev.ts_ns = 1;  // not meaningful; the inner frame has the event's time
  ev.source.node = node;
  ev.source.rank = -1;
  ev.source.plugin = "cluster";
  ev.payload = payload->data();
  ev.payload_size = payload->size();
  return ev;
}

bool unwrap_spooled(const ballast_event& event, Spooled* out) {
  if (event.schema != kSchemaSpooled || event.payload_size < 8 || event.payload == nullptr ||
      event.source.node == nullptr)
    return false;
  const auto* p = static_cast<const unsigned char*>(event.payload);
  out->node = event.source.node;
  out->seq = get_le(p, 8);
  out->frame.assign(p + 8, p + event.payload_size);
  return true;
}

bool split_host_port(const std::string& address, std::string* host, uint16_t* port, std::string* error) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    *error = "'" + address + "': expected host:port";
    return false;
  }
  std::string p = address.substr(colon + 1);
  unsigned long v = 0;
  for (char c : p) {
    if (c < '0' || c > '9' || v > 65535) {
      *error = "'" + address + "': bad port";
      return false;
    }
    v = v * 10 + static_cast<unsigned long>(c - '0');
  }
  if (v == 0 || v > 65535) {
    *error = "'" + address + "': port must be 1..65535";
    return false;
  }
  *host = address.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  *port = static_cast<uint16_t>(v);
  return true;
}

}  // namespace ballast::cluster
