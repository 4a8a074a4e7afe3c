// Output of the what-if analysis: one JSON object, a short human report,
// and a Chrome/Perfetto timeline of the recorded and the ideal run.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "whatif.hpp"

namespace ballast::straggler {

nlohmann::ordered_json to_json(const WhatIfResult& r);

// A few lines: the slowdown, the kind of straggler and the top culprits.
std::string human_report(const WhatIfResult& r);

// One line: what the kind means, with the rule that named it.
std::string kind_explanation(const WhatIfResult& r);

// Writes {"traceEvents": [...]}: the recorded run as process 1, the ideal one
// as process 2, one thread per rank. Throws TraceError when it cannot write.
void write_timeline(const Timeline& timeline, const std::string& path);

}  // namespace ballast::straggler
