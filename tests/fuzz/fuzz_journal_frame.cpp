// libFuzzer: the journal frame decoder. Each input is decoded as it is, and
// as the body of a frame with a correct header and checksum (so that the
// body reader is reached); a decoded event is printed as JSON.
#include "event_codec.hpp"

#include <cstring>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ballast::OwnedEvent ev;
  size_t consumed = 0;
  std::string error;
  if (ballast::decode_frame(data, size, &ev, &consumed, &error) == 0)
    (void)ballast::event_to_json(ev.view()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::vector<unsigned char> frame(ballast::kFrameHeaderSize + size);
  std::memcpy(frame.data(), "BLF1", 4);
  const uint16_t version = ballast::kFrameVersion, flags = 0;
  const uint32_t length = uint32_t(size), crc = ballast::crc32c(data, size);
  std::memcpy(frame.data() + 4, &version, 2);
  std::memcpy(frame.data() + 6, &flags, 2);
  std::memcpy(frame.data() + 8, &length, 4);
  std::memcpy(frame.data() + 12, &crc, 4);
  if (size > 0) std::memcpy(frame.data() + ballast::kFrameHeaderSize, data, size);
  if (ballast::decode_frame(frame.data(), frame.size(), &ev, &consumed, &error) == 0) {
    (void)ballast::event_to_json(ev.view()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::vector<unsigned char> again;
    ballast::encode_frame(ev.view(), &again);
  }
  return 0;
}
