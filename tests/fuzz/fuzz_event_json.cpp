// libFuzzer: one line of an event JSON-lines file, read as `ballast policy
// check --events` reads it, then printed back as `journal cat --json` does.
#include "event_codec.hpp"
#include "json_depth.hpp"

#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (!ballast::json_depth_within(text)) return 0;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return 0;
  ballast::OwnedEvent ev;
  std::string error;
  if (ballast::event_from_json(j, &ev, &error) != 0) return 0;
  const std::string out =
      ballast::event_to_json(ev.view()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // What was printed reads back (journal -> JSON lines round-trips).
  nlohmann::json back = nlohmann::json::parse(out, nullptr, false);
  ballast::OwnedEvent ev2;
  if (back.is_discarded() || ballast::event_from_json(back, &ev2, &error) != 0) __builtin_trap();
  return 0;
}
