#include "metrics_csv.hpp"

#include "utf8.hpp"

#include "detector.hpp"

#include "gzip_reader.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

namespace ballast::machine {

namespace {

constexpr size_t kMaxLine = 16u << 20;  // one CSV record

std::string trim(const std::string& s, size_t b, size_t e) {
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return s.substr(b, e - b);
}

// One CSV record (RFC 4180): fields separated by ',', a field in double
// quotes may hold commas, and "" inside it is one quote. Spaces around a
// field are trimmed. False with *what and *column (1-based) on a bad field.
bool split(const std::string& line, std::vector<std::string>* fields, std::string* what, size_t* column) {
  fields->clear();
  size_t i = 0, n = line.size();
  if (n && line[n - 1] == '\r') --n;
  for (;;) {
    *column = fields->size() + 1;
    size_t b = i;
    while (b < n && (line[b] == ' ' || line[b] == '\t')) ++b;
    if (b < n && line[b] == '"') {
      std::string f;
      size_t k = b + 1;
      for (;;) {
        if (k >= n) {
          *what = "unterminated quoted field (a line break inside quotes is not accepted)";
          return false;
        }
        if (line[k] == '"') {
          if (k + 1 < n && line[k + 1] == '"') {
            f += '"';
            k += 2;
            continue;
          }
          ++k;
          break;
        }
        f += line[k++];
      }
      while (k < n && (line[k] == ' ' || line[k] == '\t')) ++k;
      if (k < n && line[k] != ',') {
        *what = "unexpected text after a closing quote";
        return false;
      }
      fields->push_back(std::move(f));
      if (k >= n) return true;
      i = k + 1;
    } else {
      size_t e = line.find(',', b);
      if (e == std::string::npos || e > n) {
        fields->push_back(trim(line, b, n));
        return true;
      }
      fields->push_back(trim(line, b, e));
      i = e + 1;
    }
  }
}

}  // namespace

bool read_metrics_csv(const std::string& path, MetricsTable* out, std::string* error) {
  util::MaybeGzipFile f;
  if (!f.open(path, error)) return false;
  std::string line;
  size_t lineno = 0;
  auto stream_error = [&] {
    *error = path + ":" + std::to_string(lineno + 1) + ": " + f.error();
    return false;
  };
  // Header.
  do {
    if (!f.getline(&line, kMaxLine)) {
      if (f.failed()) return stream_error();
      *error = path + ": empty file: expected a header ts,node,metric,value";
      return false;
    }
    ++lineno;
  } while (trim(line, 0, line.size()).empty());
  std::vector<std::string> fields;
  std::string what;
  size_t bad_column = 0;
  if (!split(line, &fields, &what, &bad_column)) {
    *error = path + ":" + std::to_string(lineno) + ": column " + std::to_string(bad_column) + ": " + what;
    return false;
  }
  const char* names[4] = {"ts", "node", "metric", "value"};
  size_t col[4];
  for (int k = 0; k < 4; ++k) {
    col[k] = fields.size();
    for (size_t i = 0; i < fields.size(); ++i)
      if (fields[i] == names[k]) col[k] = i;
    if (col[k] == fields.size()) {
      *error = path + ":" + std::to_string(lineno) + ": missing column '" + names[k] + "' in the header '" + line +
               "' (expected ts,node,metric,value)";
      return false;
    }
  }
  const size_t header_columns = fields.size();
  std::unordered_map<std::string, uint32_t> node_ids, metric_ids;
  std::vector<int64_t> last_ts;  // per node
  auto intern = [](std::unordered_map<std::string, uint32_t>& ids, std::vector<std::string>& names_,
                   const std::string& s) {
    auto it = ids.find(s);
    if (it != ids.end()) return it->second;
    uint32_t id = static_cast<uint32_t>(names_.size());
    names_.push_back(s);
    ids.emplace(s, id);
    return id;
  };
  while (f.getline(&line, kMaxLine)) {
    ++lineno;
    if (trim(line, 0, line.size()).empty()) continue;
    std::string where = path + ":" + std::to_string(lineno) + ": ";
    if (!split(line, &fields, &what, &bad_column)) {
      *error = where + "column " + std::to_string(bad_column) + ": " + what;
      return false;
    }
    if (fields.size() < header_columns) {
      *error =
          where + "expected " + std::to_string(header_columns) + " columns, found " + std::to_string(fields.size());
      return false;
    }
    auto column = [&](int k) { return where + "column " + std::to_string(col[k] + 1) + " (" + names[k] + "): "; };
    double v[2];
    for (int k : {0, 3}) {
      const std::string& t = fields[col[k]];
      char* e = nullptr;
      double d = std::strtod(t.c_str(), &e);
      if (t.empty() || *e != '\0') {
        *error = column(k) + "not a number: '" + t + "'";
        return false;
      }
      if (!std::isfinite(d)) {
        *error = column(k) + "not a finite number: '" + t + "'";
        return false;
      }
      v[k == 0 ? 0 : 1] = d;
    }
    for (int k : {1, 2}) {
      if (fields[col[k]].empty()) {
        *error = column(k) + "empty";
        return false;
      }
      if (!util::valid_utf8(fields[col[k]])) {
        *error = column(k) + "not valid UTF-8";
        return false;
      }
    }
    if (std::fabs(v[0]) > 9e9) {
      *error = column(0) + "out of range (seconds): '" + fields[col[0]] + "'";
      return false;
    }
    MetricRow r;
    r.ts_ns = std::llround(v[0] * 1e9);
    r.node = intern(node_ids, out->nodes, fields[col[1]]);
    r.metric = intern(metric_ids, out->metrics, fields[col[2]]);
    r.value = v[1];
    if (last_ts.size() <= r.node) last_ts.resize(r.node + 1, INT64_MIN);
    if (r.ts_ns < last_ts[r.node]) {
      *error = column(0) + "time goes backwards for node '" + fields[col[1]] + "': " + fields[col[0]] + " after " +
               std::to_string(static_cast<double>(last_ts[r.node]) / 1e9);
      return false;
    }
    last_ts[r.node] = r.ts_ns;
    out->rows.push_back(r);
  }
  if (f.failed()) return stream_error();
  return true;
}

}  // namespace ballast::machine
