// Events as JSON (the JSON-lines form of `ballast journal cat --json` and
// `policy check --events`) turned into suspicions, and the ranking as the
// JSON payload of `suspects.ranking`.
#pragma once

#include "fusion.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace ballast::fusion {

// Feed one event {"topic","ts","source","payload"} to *f. Topics other than
// fault.*, node.silent, straggler.report and placement.plan are ignored
// (returns true). False with *error naming the field when a known topic's
// payload is malformed.
bool feed_event(const nlohmann::json& event, Fusion* f, std::string* error);

// The ranking at now_ns as the payload of suspects.ranking:
// {"ts_ns", "suspects": [{"node","score","alerting","since_ns","evidence":[...]}]}.
nlohmann::json ranking_json(const std::vector<Suspect>& ranking, int64_t now_ns);

// What changes the published list: the order of suspects, who is alerting,
// and each score to 0.05. Equal keys: nothing to publish.
std::string ranking_key(const std::vector<Suspect>& ranking);

// Nesting depth of JSON text (brackets outside strings), to refuse input
// deeper than a reader should recurse into before parsing it.
size_t json_depth(const std::string& text);

}  // namespace ballast::fusion
