// Reading recorded events: a journal (frames starting with "BLF1") or JSON
// lines ({"topic":..., "ts":..., "source":..., "payload":{...}} per line).
#pragma once

#include "event_codec.hpp"

#include <functional>
#include <string>

namespace ballast::cli {

// Calls on_event for every event of `path` in order. A malformed line or
// frame stops the read with an error naming the file and the line (or byte
// offset). Status; the message is in last_error().
int read_event_file(const std::string& path, const std::function<void(const OwnedEvent&)>& on_event);

}  // namespace ballast::cli
