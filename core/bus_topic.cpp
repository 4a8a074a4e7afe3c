#include "bus_topic.hpp"

#include "bus.hpp"

namespace ballast {

bool valid_topic(std::string_view topic) {
  if (topic.empty()) return false;
  bool segment_empty = true;
  for (char c : topic) {
    if (c == '.') {
      if (segment_empty) return false;
      segment_empty = true;
    } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-') {
      segment_empty = false;
    } else {
      return false;
    }
  }
  return !segment_empty;
}

bool valid_pattern(std::string_view pattern) {
  if (pattern == "*") return true;
  if (pattern.size() > 2 && pattern.substr(pattern.size() - 2) == ".*")
    return valid_topic(pattern.substr(0, pattern.size() - 2));
  return valid_topic(pattern);
}

bool pattern_matches(std::string_view pattern, std::string_view topic) {
  if (pattern == "*") return true;
  if (pattern.size() > 2 && pattern.substr(pattern.size() - 2) == ".*") {
    std::string_view prefix = pattern.substr(0, pattern.size() - 1);  // keeps the dot
    return topic.size() > prefix.size() && topic.substr(0, prefix.size()) == prefix;
  }
  return pattern == topic;
}

}  // namespace ballast
