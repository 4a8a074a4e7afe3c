#include "fusion_json.hpp"

#include <cmath>

namespace ballast::fusion {

namespace {

std::string text(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

double number(const nlohmann::json& j, const char* key, double dflt = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : dflt;
}

int64_t ns(double v) { return std::isfinite(v) && std::fabs(v) < 9e18 ? static_cast<int64_t>(v) : 0; }

}  // namespace

size_t json_depth(const std::string& t) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < t.size(); ++i) {
    char c = t[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth) {
      --depth;
    }
  }
  return deepest;
}

bool feed_event(const nlohmann::json& ev, Fusion* f, std::string* error) {
  if (!ev.is_object()) {
    *error = "an event must be a JSON object";
    return false;
  }
  std::string topic = text(ev, "topic");
  auto pit = ev.find("payload");
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& p = pit != ev.end() && pit->is_object() ? *pit : empty;
  int64_t ts = ns(number(ev, "ts") * 1e9);
  if (topic.rfind("fault.", 0) == 0 || topic == "node.silent") {
    Suspicion s;
    s.detector = text(p, "detector");
    auto src = ev.find("source");
    if (src != ev.end() && src->is_object()) {
      if (s.detector.empty()) s.detector = text(*src, "plugin");
      s.node = text(*src, "node");
    }
    if (s.detector.empty()) s.detector = "unknown";
    s.subject = text(p, "subject");
    s.rank = static_cast<int32_t>(number(p, "rank", -1));
    if (s.subject.empty() && s.rank < 0) {
      *error = "payload.subject: missing (and no payload.rank)";
      return false;
    }
    s.kind = text(p, "kind");
    s.metric = text(p, "metric");
    s.score = number(p, "score");
    s.confidence = number(p, "confidence");
    s.confirmed = topic == "fault.confirmed" || number(p, "stage") == 1 || topic == "node.silent";
    s.at_ns = p.contains("detected_ns") ? ns(number(p, "detected_ns")) : ts;
    s.since_ns = p.contains("since_ns") ? ns(number(p, "since_ns")) : s.at_ns;
    s.evidence = text(p, "evidence");
    f->add(std::move(s));
  } else if (topic == "straggler.report") {
    auto c = p.find("culprits");
    if (c == p.end()) return true;
    if (!c->is_array()) {
      *error = "payload.culprits: expected a list";
      return false;
    }
    double slowdown = number(p, "slowdown", 1);
    for (const auto& e : *c) {
      if (!e.is_object() || text(e, "dimension") != "rank") continue;
      std::string name = text(e, "name");
      char* end = nullptr;
      long rank = std::strtol(name.c_str(), &end, 10);
      if (name.empty() || *end || rank < 0 || rank > INT32_MAX) {
        *error = "payload.culprits: rank '" + name + "' is not a rank number";
        return false;
      }
      nlohmann::json evidence = {
          {"slowdown", slowdown}, {"culprit_slowdown", number(e, "slowdown", 1)}, {"kind", text(p, "kind")}};
      f->add_straggler(static_cast<int32_t>(rank), text(p, "kind"), number(e, "slowdown", 1), slowdown, ts,
                       evidence.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
  } else if (topic == "placement.plan") {
    auto n = p.find("nodes");
    if (n == p.end() || !n->is_array()) {
      *error = "payload.nodes: expected a list";
      return false;
    }
    std::vector<std::pair<std::string, int32_t>> nodes;
    for (const auto& e : *n)
      if (e.is_object()) nodes.emplace_back(text(e, "name"), static_cast<int32_t>(number(e, "first_rank", -1)));
    f->set_placement(std::move(nodes));
  }
  return true;
}

nlohmann::json ranking_json(const std::vector<Suspect>& ranking, int64_t now_ns) {
  nlohmann::json list = nlohmann::json::array();
  for (const Suspect& s : ranking) {
    nlohmann::json ev = nlohmann::json::array();
    for (const Evidence& e : s.evidence) {
      nlohmann::json j = {{"detector", e.from.detector},
                          {"kind", e.from.kind},
                          {"weight", e.weight},
                          {"score", std::isfinite(e.from.score) ? e.from.score : 0},
                          {"confirmed", e.from.confirmed},
                          {"since_ns", e.from.since_ns},
                          {"at_ns", e.from.at_ns}};
      if (!e.from.metric.empty()) j["metric"] = e.from.metric;
      if (e.from.subject != s.node) j["subject"] = e.from.subject;
      if (!e.from.evidence.empty()) {
        nlohmann::json d = json_depth(e.from.evidence) <= 32 ? nlohmann::json::parse(e.from.evidence, nullptr, false)
                                                             : nlohmann::json(nlohmann::json::value_t::discarded);
        j["evidence"] = d.is_discarded() ? nlohmann::json(e.from.evidence) : d;
      }
      ev.push_back(std::move(j));
    }
    list.push_back({{"node", s.node},
                    {"score", s.score},
                    {"alerting", s.alerting},
                    {"since_ns", s.since_ns},
                    {"evidence", std::move(ev)}});
  }
  return {{"ts_ns", now_ns}, {"suspects", std::move(list)}};
}

std::string ranking_key(const std::vector<Suspect>& ranking) {
  std::string key;
  for (const Suspect& s : ranking)
    key += s.node + (s.alerting ? "!" : "?") + std::to_string(std::lround(s.score * 20)) + "\n";
  return key;
}

}  // namespace ballast::fusion
