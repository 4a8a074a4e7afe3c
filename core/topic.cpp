#include "topic.hpp"

namespace ballast {

namespace {

constexpr std::string_view kTopicRule = "dotted segments of lower-case letters, digits, '_' and '-'";

bool is_prefix_pattern(std::string_view p) { return p.size() > 2 && p.substr(p.size() - 2) == ".*"; }

}  // namespace

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
  if (is_prefix_pattern(pattern)) return valid_topic(pattern.substr(0, pattern.size() - 2));
  return valid_topic(pattern);
}

std::string invalid_topic_message(std::string_view topic) {
  return "\"" + std::string(topic) + "\" is not a valid topic (" + std::string(kTopicRule) +
         ", such as \"fault.confirmed\")";
}

std::string invalid_pattern_message(std::string_view pattern) {
  return "\"" + std::string(pattern) + "\" is not a valid pattern (a topic such as \"fault.confirmed\", " +
         "a prefix such as \"fault.*\", or \"*\"; topics are " + std::string(kTopicRule) + ")";
}

TopicMatcher TopicMatcher::of(std::string_view pattern) {
  TopicMatcher m;
  if (pattern == "*") {
    m.kind = Kind::all;
  } else if (is_prefix_pattern(pattern)) {
    m.kind = Kind::prefix;
    m.text = pattern.substr(0, pattern.size() - 1);  // keeps the dot
  } else {
    m.kind = Kind::exact;
    m.text = pattern;
  }
  return m;
}

bool pattern_matches(std::string_view pattern, std::string_view topic) {
  return TopicMatcher::of(pattern).matches(topic);
}

bool pattern_covers(std::string_view outer, std::string_view inner) {
  if (outer == "*" || outer == inner) return true;
  if (!is_prefix_pattern(outer) || inner == "*") return false;
  // Every topic `inner` matches starts with inner's own text, which must
  // start with outer's prefix ("a." covers "a.b" and "a.b.*").
  const std::string_view prefix = outer.substr(0, outer.size() - 1);
  return inner.size() > prefix.size() && inner.substr(0, prefix.size()) == prefix;
}

}  // namespace ballast
