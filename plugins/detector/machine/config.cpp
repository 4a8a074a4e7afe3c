#include "config.hpp"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cmath>
#include <cstdlib>

namespace ballast::machine {

namespace {

class LuaSubset {
 public:
  LuaSubset(const std::string& text, const std::string& name) : s_(text), name_(name) {}

  bool parse(ConfigText* out, std::string* error) {
    skip();
    if (word("return")) skip();
    if (!table("", out, 0)) return fail(error);
    skip();
    if (pos_ < s_.size()) {
      err_ = "unexpected text after the table";
      return fail(error);
    }
    return true;
  }

 private:
  bool fail(std::string* error) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    *error = name_ + ":" + std::to_string(line) + ":" + std::to_string(col) + ": " + err_;
    return false;
  }

  void skip() {
    while (pos_ < s_.size()) {
      if (std::isspace(static_cast<unsigned char>(s_[pos_]))) {
        ++pos_;
      } else if (s_.compare(pos_, 4, "--[[") == 0) {
        size_t end = s_.find("]]", pos_ + 4);
        pos_ = end == std::string::npos ? s_.size() : end + 2;
      } else if (s_.compare(pos_, 2, "--") == 0) {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  bool word(const char* w) {
    size_t n = std::char_traits<char>::length(w);
    if (s_.compare(pos_, n, w) != 0) return false;
    if (pos_ + n < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_ + n])) || s_[pos_ + n] == '_'))
      return false;
    pos_ += n;
    return true;
  }

  bool identifier(std::string* id) {
    size_t b = pos_;
    if (pos_ >= s_.size() || !(std::isalpha(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_'))
      return false;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_'))
      ++pos_;
    *id = s_.substr(b, pos_ - b);
    return true;
  }

  bool string_lit(std::string* v) {
    char q = s_[pos_++];
    v->clear();
    while (pos_ < s_.size() && s_[pos_] != q) {
      char c = s_[pos_++];
      if (c == '\n') {
        err_ = "newline in a string";
        return false;
      }
      if (c == '\\' && pos_ < s_.size()) {
        char e = s_[pos_++];
        c = e == 'n' ? '\n' : e == 't' ? '\t' : e;
      }
      *v += c;
    }
    if (pos_ >= s_.size()) {
      err_ = "unterminated string";
      return false;
    }
    ++pos_;
    if (!valid_utf8(*v)) {
      err_ = "string is not valid UTF-8";
      return false;
    }
    return true;
  }

  // A scalar as config_get text; *is_string tells JSON how to quote it.
  bool scalar(std::string* v, bool* is_string) {
    *is_string = false;
    if (pos_ < s_.size() && (s_[pos_] == '"' || s_[pos_] == '\'')) {
      *is_string = true;
      return string_lit(v);
    }
    if (word("true")) {
      *v = "true";
      return true;
    }
    if (word("false")) {
      *v = "false";
      return true;
    }
    const char* b = s_.c_str() + pos_;
    char* e = nullptr;
    double d = std::strtod(b, &e);
    if (e == b || !std::isfinite(d)) {
      err_ = "expected a number, a string, true, false or a table";
      return false;
    }
    *v = s_.substr(pos_, static_cast<size_t>(e - b));
    pos_ += static_cast<size_t>(e - b);
    return true;
  }

  // A configuration needs two levels; deeper input is refused, not recursed into.
  static constexpr int kMaxDepth = 16;

  bool table(const std::string& prefix, ConfigText* out, int depth) {
    if (pos_ >= s_.size() || s_[pos_] != '{') {
      err_ = "expected '{'";
      return false;
    }
    if (depth >= kMaxDepth) {
      err_ = "tables nested deeper than " + std::to_string(kMaxDepth) + " levels";
      return false;
    }
    ++pos_;
    nlohmann::json list = nlohmann::json::array();
    bool has_list = false;
    for (;;) {
      skip();
      if (pos_ >= s_.size()) {
        err_ = "unterminated table: expected '}'";
        return false;
      }
      if (s_[pos_] == '}') {
        ++pos_;
        break;
      }
      size_t save = pos_;
      std::string key;
      bool keyed = false;
      if (s_[pos_] == '[') {
        ++pos_;
        skip();
        if (pos_ >= s_.size() || (s_[pos_] != '"' && s_[pos_] != '\'')) {
          err_ = "expected a string key in [ ]";
          return false;
        }
        if (!string_lit(&key)) return false;
        skip();
        if (pos_ >= s_.size() || s_[pos_] != ']') {
          err_ = "expected ']'";
          return false;
        }
        ++pos_;
        keyed = true;
      } else if (identifier(&key)) {
        skip();
        keyed = pos_ < s_.size() && s_[pos_] == '=';
        if (!keyed) pos_ = save;
      }
      if (keyed) {
        skip();
        if (pos_ >= s_.size() || s_[pos_] != '=') {
          err_ = "expected '='";
          return false;
        }
        ++pos_;
        skip();
        std::string full = prefix.empty() ? key : prefix + "." + key;
        if (pos_ < s_.size() && s_[pos_] == '{') {
          if (!table(full, out, depth + 1)) return false;
        } else {
          std::string v;
          bool is_string;
          if (!scalar(&v, &is_string)) return false;
          (*out)[full] = v;
        }
      } else {
        std::string v;
        bool is_string;
        if (pos_ < s_.size() && s_[pos_] == '{') {
          err_ = "nested tables in a list are not supported";
          return false;
        }
        if (!scalar(&v, &is_string)) return false;
        if (is_string)
          list.push_back(v);
        else if (v == "true" || v == "false")
          list.push_back(v == "true");
        else
          list.push_back(std::strtod(v.c_str(), nullptr));
        has_list = true;
      }
      skip();
      if (pos_ < s_.size() && (s_[pos_] == ',' || s_[pos_] == ';')) {
        ++pos_;
      } else if (pos_ < s_.size() && s_[pos_] != '}') {
        err_ = "expected ',' or '}'";
        return false;
      }
    }
    if (has_list) {
      if (prefix.empty()) {
        err_ = "the top-level table must have named fields";
        return false;
      }
      (*out)[prefix] = list.dump();
    }
    return true;
  }

  const std::string& s_;
  std::string name_;
  size_t pos_ = 0;
  std::string err_;
};

bool to_number(const std::string& text, double* v) {
  char* e = nullptr;
  *v = std::strtod(text.c_str(), &e);
  return e != text.c_str() && *e == '\0' && std::isfinite(*v);
}

}  // namespace

bool parse_lua_table(const std::string& text, const std::string& name, ConfigText* out,
                     std::string* error) {
  return LuaSubset(text, name).parse(out, error);
}

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = {
      "period", "lateness", "window", "threshold", "continuity", "silent_after", "rel_floor", "abs_floor",
      "spread_memory", "warmup", "min_nodes", "max_outlier_fraction", "hold_peers", "max_metrics",
      "metrics", "min_deviation", "rel_floors"};
  return keys;
}

bool apply_config(const std::function<bool(const std::string&, std::string*)>& get,
                  DetectorConfig* c, std::string* error) {
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
      *error = std::string("config key '") + n.key + "': expected a number >= " +
               std::to_string(n.min) + ", got '" + text + "'";
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
      if (v.is_number()) d = v.get<double>();
      else if (!v.is_string() || !to_number(v.get<std::string>(), &d)) d = -1;
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
