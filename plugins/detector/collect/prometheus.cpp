#include "prometheus.hpp"

#include <ballast/events.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

namespace ballast::collect {

namespace {

bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }
bool name_char(char c) { return name_start(c) || std::isdigit(static_cast<unsigned char>(c)); }

// Go's ParseFloat spellings used by exporters: NaN, +Inf, -Inf (any case).
bool parse_value(const std::string& t, double* v) {
  if (t.empty()) return false;
  char* e = nullptr;
  *v = std::strtod(t.c_str(), &e);
  return *e == '\0';
}

std::string family_of(const std::string& name, const std::unordered_map<std::string, std::string>& types) {
  if (types.count(name)) return name;
  for (const char* suffix : {"_bucket", "_sum", "_count", "_created", "_total"}) {
    size_t n = std::strlen(suffix);
    if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0) {
      std::string fam = name.substr(0, name.size() - n);
      if (types.count(fam)) return fam;
    }
  }
  return {};
}

}  // namespace

bool parse_exposition(const std::string& text, std::vector<PromSample>* out, std::string* error) {
  std::unordered_map<std::string, std::string> types;
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t i = 0;
    auto fail = [&](const std::string& what) {
      *error = std::to_string(line_no) + ":" + std::to_string(i + 1) + ": " + what;
      return false;
    };
    auto skip_ws = [&] {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    };
    skip_ws();
    if (i == line.size()) continue;
    if (line[i] == '#') {
      // "# TYPE name type" matters; "# HELP" and other comments do not.
      if (line.compare(i, 7, "# TYPE ") == 0) {
        size_t b = i + 7, sp = line.find(' ', b);
        if (sp == std::string::npos) return fail("# TYPE without a type");
        std::string type = line.substr(sp + 1);
        while (!type.empty() && type.back() == ' ') type.pop_back();
        types[line.substr(b, sp - b)] = type;
      }
      continue;
    }
    PromSample s;
    if (!name_start(line[i])) return fail("expected a metric name");
    size_t b = i;
    while (i < line.size() && name_char(line[i])) ++i;
    s.name = line.substr(b, i - b);
    skip_ws();
    if (i < line.size() && line[i] == '{') {
      ++i;
      for (;;) {
        skip_ws();
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        if (i >= line.size() || !name_start(line[i])) return fail("expected a label name or '}'");
        b = i;
        while (i < line.size() && name_char(line[i])) ++i;
        std::string label = line.substr(b, i - b);
        skip_ws();
        if (i >= line.size() || line[i] != '=') return fail("expected '=' after label " + label);
        ++i;
        skip_ws();
        if (i >= line.size() || line[i] != '"') return fail("expected '\"' to open the value of label " + label);
        ++i;
        std::string value;
        for (;;) {
          if (i >= line.size()) return fail("unterminated value of label " + label);
          char c = line[i++];
          if (c == '"') break;
          if (c == '\\') {
            if (i >= line.size()) return fail("unterminated escape in label " + label);
            char e = line[i++];
            if (e == 'n')
              c = '\n';
            else if (e == '\\' || e == '"')
              c = e;
            else
              return fail(std::string("unknown escape \\") + e + " in label " + label);
          }
          value += c;
        }
        s.labels.emplace_back(std::move(label), std::move(value));
        skip_ws();
        if (i < line.size() && line[i] == ',')
          ++i;
        else if (i >= line.size() || line[i] != '}')
          return fail("expected ',' or '}' after a label");
      }
    }
    skip_ws();
    b = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    std::string value = line.substr(b, i - b);
    if (!parse_value(value, &s.value)) {
      i = b;
      return fail("not a sample value: '" + value + "'");
    }
    skip_ws();
    if (i < line.size()) {
      b = i;
      char* e = nullptr;
      long long ts = std::strtoll(line.c_str() + i, &e, 10);
      i = static_cast<size_t>(e - line.c_str());
      skip_ws();
      if (i == b || i != line.size()) return fail("expected a timestamp (ms) or the end of the line");
      s.ts_ms = ts;
    }
    std::string fam = family_of(s.name, types);
    s.type = fam.empty() ? "untyped" : types[fam];
    out->push_back(std::move(s));
  }
  return true;
}

std::string series_name(const PromSample& s) {
  if (s.labels.empty()) return s.name;
  std::string n = s.name + "{";
  for (size_t k = 0; k < s.labels.size(); ++k) {
    if (k) n += ',';
    n += s.labels[k].first + "=\"";
    for (char c : s.labels[k].second) {
      if (c == '\n')
        n += "\\n";
      else if (c == '"' || c == '\\')
        (n += '\\') += c;
      else
        n += c;
    }
    n += '"';
  }
  return n + "}";
}

bool Scraper::scrape(int64_t ts, std::vector<Sample>* out, std::string* error) {
  std::string body;
  if (!http_.get(url_, &body, error)) return false;
  std::vector<PromSample> series;
  if (!parse_exposition(body, &series, error)) {
    *error = url_ + ":" + *error;
    return false;
  }
  for (const PromSample& s : series) {
    int64_t at = s.ts_ms ? s.ts_ms * 1000000 : ts;
    if (map_names_) {
      detector_names::Mapping m;
      if (detector_names::map_series(s.name, s.labels, &m)) {
        if (std::isfinite(s.value))
          names_.add("", series_name(s), s.name, s.labels, at, s.value);
        else
          out->push_back(Sample{m.name, 0.0,
                                static_cast<uint32_t>(BALLAST_SAMPLE_INVALID) |
                                    (m.counter ? static_cast<uint32_t>(BALLAST_SAMPLE_COUNTER) : 0u)});
        continue;
      }
    }
    std::string name = prefix_ + series_name(s);
    bool cumulative = s.type == "counter" ||
                      ((s.type == "histogram" || s.type == "summary") &&
                       (s.name.ends_with("_sum") || s.name.ends_with("_count") || s.name.ends_with("_bucket")));
    if (!cumulative) {
      add_gauge(out, name, s.value);
    } else if (!std::isfinite(s.value)) {
      out->push_back(Sample{name, 0.0, BALLAST_SAMPLE_COUNTER | BALLAST_SAMPLE_INVALID});
    } else {
      rates_.add(out, name, s.value, at);
    }
  }
  rates_.sweep();
  std::vector<detector_names::Normaliser::Out> mapped;
  names_.flush(&mapped);
  for (const auto& m : mapped) add_gauge(out, m.metric, m.value);
  return true;
}

}  // namespace ballast::collect
