// libFuzzer: a stream of cluster link messages (core/cluster/wire.hpp), as
// an agent or the controller reads them off its TLS connection: each
// message decoded, an event or action body decoded as an event frame, and
// the journal's wrapper of an event unwrapped again.
#include "wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ballast;
  size_t at = 0;
  while (at < size) {
    cluster::Message m{};
    size_t consumed = 0;
    std::string error;
    if (cluster::decode_message(data + at, size - at, &m, &consumed, &error) != 1) break;
    at += consumed;
    if (m.type != cluster::MsgType::event && m.type != cluster::MsgType::action) continue;
    OwnedEvent ev;
    size_t used = 0;
    if (decode_frame(m.body, m.body_size, &ev, &used, &error) != BALLAST_OK) continue;
    std::vector<unsigned char> payload;
    const ballast_event wrapped = cluster::wrap_spooled("node", m.number, m.body, used, &payload);
    cluster::Spooled back;
    if (!cluster::unwrap_spooled(wrapped, &back) || back.frame.size() != used) __builtin_trap();
  }
  return 0;
}
