#include "detector_config.hpp"

#include "lua_config.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

namespace ballast::machine {

namespace {

bool to_number(const std::string& text, double* v) {
  char* e = nullptr;
  *v = std::strtod(text.c_str(), &e);
  return e != text.c_str() && *e == '\0' && std::isfinite(*v);
}

}  // namespace

bool load_config_file(const std::string& path, DetectorConfig* config, std::string* error) {
  nlohmann::json table;
  if (!util::eval_lua_config(path, &table, error)) return false;
  if (!table.is_object()) {
    *error = path + ": expected a table of keys, got a list";
    return false;
  }
  const auto& known = config_keys();
  for (const auto& [key, value] : table.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      *error = path + ": unknown key '" + key + "'";
      return false;
    }
  }
  auto get = [&](const std::string& k, std::string* v) {
    auto it = table.find(k);
    if (it == table.end()) return false;
    *v = util::config_text(*it);
    return true;
  };
  if (!apply_config(get, config, error)) {
    *error = path + ": " + *error;
    return false;
  }
  return true;
}

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = {
      "period",     "lateness",    "window",        "threshold",     "continuity", "silent_after",
      "rel_floor",  "abs_floor",   "spread_memory", "warmup",        "min_nodes",  "max_outlier_fraction",
      "hold_peers", "max_metrics", "metrics",       "min_deviation", "rel_floors"};
  return keys;
}

bool apply_config(const std::function<bool(const std::string&, std::string*)>& get, DetectorConfig* c,
                  std::string* error) {
  struct Num {
    const char* key;
    double* field;
    double min;
  };
  double continuity = c->continuity, min_nodes = c->min_nodes, warmup = c->warmup;
  double max_metrics = static_cast<double>(c->max_metrics);
  Num nums[] = {{"period", &c->period_s, 1e-3},
                {"lateness", &c->lateness_s, 0},
                {"window", &c->window_s, 1e-3},
                {"threshold", &c->threshold, 0},
                {"continuity", &continuity, 1},
                {"silent_after", &c->silent_after_s, 1e-3},
                {"rel_floor", &c->rel_floor, 0},
                {"abs_floor", &c->abs_floor, 0},
                {"spread_memory", &c->spread_memory, 1},
                {"warmup", &warmup, 0},
                {"min_nodes", &min_nodes, 3},
                {"max_outlier_fraction", &c->max_outlier_fraction, 0},
                {"max_metrics", &max_metrics, 1}};
  for (const Num& n : nums) {
    std::string text;
    if (!get(n.key, &text)) continue;
    double v;
    if (!to_number(text, &v) || v < n.min) {
      *error = std::string("config key '") + n.key + "': expected a number >= " + std::to_string(n.min) + ", got '" +
               text + "'";
      return false;
    }
    *n.field = v;
  }
  c->continuity = static_cast<int>(continuity);
  c->min_nodes = static_cast<int>(min_nodes);
  c->warmup = static_cast<int>(warmup);
  c->max_metrics = static_cast<size_t>(max_metrics);
  std::string text;
  if (get("hold_peers", &text)) {
    if (text != "true" && text != "false") {
      *error = "config key 'hold_peers': expected true or false, got '" + text + "'";
      return false;
    }
    c->hold_peers = text == "true";
  }
  if (get("metrics", &text)) {
    // A list arrives as JSON text; a single pattern as plain text.
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || j.is_string()) j = nlohmann::json::array({j.is_string() ? j : nlohmann::json(text)});
    if (!j.is_array() || j.empty()) {
      *error = "config key 'metrics': expected a non-empty list of metric patterns, got '" + text + "'";
      return false;
    }
    std::vector<std::string> list;
    for (const auto& e : j) {
      if (!e.is_string()) {
        *error = "config key 'metrics': every entry must be a string, got " + e.dump();
        return false;
      }
      list.push_back(e.get<std::string>());
    }
    c->metrics = std::move(list);
  }
  // Tables { ["pattern"] = value, ... }, JSON text from the host; the
  // user's patterns are matched before the defaults.
  for (auto [key, list] : {std::pair{"min_deviation", &c->min_deviation}, std::pair{"rel_floors", &c->rel_floors}}) {
    if (!get(key, &text)) continue;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object()) {
      *error = std::string("config key '") + key + "': expected a table of pattern = number, got '" + text + "'";
      return false;
    }
    std::vector<std::pair<std::string, double>> mine;
    for (const auto& [pattern, v] : j.items()) {
      double d = 0;
      if (v.is_number())
        d = v.get<double>();
      else if (!v.is_string() || !to_number(v.get<std::string>(), &d))
        d = -1;
      if (!(d >= 0) || !std::isfinite(d)) {
        *error = std::string("config key '") + key + "." + pattern + "': expected a number >= 0, got " +
                 v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        return false;
      }
      mine.emplace_back(pattern, d);
    }
    list->insert(list->begin(), mine.begin(), mine.end());
  }
  return true;
}

}  // namespace ballast::machine
