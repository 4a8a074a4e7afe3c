// The topic grammar (abi/ballast/event.h), the one implementation used by the
// bus, the policy and `ballast policy check`.
//
// A topic is dotted segments of [a-z0-9_-], none empty ("fault.confirmed").
// A subscription pattern is a topic (exact match), a topic followed by ".*"
// (every topic that starts with it and a dot: "fault.*"), or "*" (every topic).
#pragma once

#include <string>
#include <string_view>

namespace ballast {

bool valid_topic(std::string_view topic);
bool valid_pattern(std::string_view pattern);

// The message for an invalid topic or pattern, the same wherever it is
// refused: "\"Job.State\" is not a valid topic (...)". Call only when invalid.
std::string invalid_topic_message(std::string_view topic);
std::string invalid_pattern_message(std::string_view pattern);

// Whether `pattern` (valid_pattern) matches `topic`.
bool pattern_matches(std::string_view pattern, std::string_view topic);

// A valid pattern taken apart once, for matching many topics: `text` is the
// exact topic or the prefix with its dot. Points into the pattern's storage.
struct TopicMatcher {
  enum class Kind { all, prefix, exact } kind = Kind::all;
  std::string_view text;

  static TopicMatcher of(std::string_view valid_pattern);
  bool matches(std::string_view topic) const {
    switch (kind) {
      case Kind::all:
        return true;
      case Kind::exact:
        return topic == text;
      case Kind::prefix:
        return topic.size() > text.size() && topic.substr(0, text.size()) == text;
    }
    return false;
  }
};

// Whether pattern `outer` matches every topic that pattern `inner` matches.
bool pattern_covers(std::string_view outer, std::string_view inner);

}  // namespace ballast
