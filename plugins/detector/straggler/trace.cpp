#include "trace.hpp"

#include "gzip_reader.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

namespace ballast::straggler {
namespace {

enum Column { kDpRank, kStage, kRank, kStep, kOptype, kStart, kDuration, kSeqId, kMc, kMbId, kGmc, kIgnored };
constexpr std::array<std::string_view, 11> kColumnNames = {"dp_rank",  "stage",  "rank", "step",  "optype", "start_ts",
                                                           "duration", "seq_id", "mc",   "mb_id", "gmc"};

[[noreturn]] void fail(const std::string& source, size_t line, std::string_view column, const std::string& what) {
  std::string msg = source + ":" + std::to_string(line) + ": ";
  if (!column.empty()) msg += "column " + std::string(column) + ": ";
  throw TraceError(msg + what);
}

std::string quoted(std::string_view field) {
  constexpr size_t kMax = 40;  // keep a garbage line from flooding the message
  std::string s(field.substr(0, kMax));
  return "'" + s + (field.size() > kMax ? "...'" : "'");
}

// A byte buffer that grows without zero-filling (inflated traces are tens of MB).
class Buffer {
 public:
  char* data() { return data_.get(); }
  const char* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return cap_; }
  std::string_view view() const { return {data_.get(), size_}; }
  void set_size(size_t n) { size_ = n; }
  void reserve(size_t n) {
    if (n <= cap_) return;
    std::unique_ptr<char[]> grown(new char[n]);
    if (size_) std::memcpy(grown.get(), data_.get(), size_);
    data_ = std::move(grown);
    cap_ = n;
  }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0, cap_ = 0;
};

Buffer read_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw TraceError(path + ": cannot open: " + std::strerror(errno));
  Buffer buf;
  buf.reserve(1 << 20);
  if (std::fseek(f.get(), 0, SEEK_END) == 0) {  // a regular file: read it in one go
    long size = std::ftell(f.get());
    if (size > 0) buf.reserve(static_cast<size_t>(size) + 1);
    std::rewind(f.get());
  }
  for (;;) {
    if (buf.size() == buf.capacity()) buf.reserve(buf.capacity() * 2);
    size_t n = std::fread(buf.data() + buf.size(), 1, buf.capacity() - buf.size(), f.get());
    if (n == 0) break;
    buf.set_size(buf.size() + n);
  }
  if (std::ferror(f.get())) throw TraceError(path + ": read error: " + std::strerror(errno));
  return buf;
}

// Where text that was cut off ends: its line and, from the header, the column.
[[noreturn]] void fail_truncated(const std::string& path, std::string_view text, const std::string& what) {
  size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
  std::string column;
  size_t header_end = text.find('\n');
  if (header_end != std::string_view::npos && line > 1) {
    std::string_view last = text.substr(text.rfind('\n') + 1);
    auto field = static_cast<size_t>(std::count(last.begin(), last.end(), ','));
    std::string_view header = text.substr(0, header_end);
    size_t begin = 0;
    for (size_t i = 0; i < field && begin != std::string_view::npos; ++i) {
      begin = header.find(',', begin);
      if (begin != std::string_view::npos) ++begin;
    }
    if (begin != std::string_view::npos) {
      column = std::string(header.substr(begin, header.find(',', begin) - begin));
      if (!column.empty() && column.back() == '\r') column.pop_back();
    }
  }
  fail(path, line, column, what);
}

Buffer gunzip(const Buffer& data, const std::string& path) {
  Buffer out;
  // The last member's trailer holds the text size modulo 2^32: a good first guess.
  size_t guess = 0;
  if (data.size() >= 18) {
    const auto* t = reinterpret_cast<const unsigned char*>(data.data() + data.size() - 4);
    guess = t[0] | (t[1] << 8) | (t[2] << 16) | (static_cast<size_t>(t[3]) << 24);
  }
  out.reserve(std::max(guess + 1, data.size() * 4 + 1024));
  util::Gunzip z;
  z.feed(data.data(), data.size(), true);
  for (;;) {
    if (out.size() == out.capacity()) out.reserve(out.capacity() * 2);
    out.set_size(out.size() + z.read(out.data() + out.size(), out.capacity() - out.size()));
    if (z.done()) return out;
    if (z.failed()) fail_truncated(path, out.view(), z.error());
  }
}

class FieldParser {
 public:
  FieldParser(const std::string& source, size_t line) : source_(source), line_(line) {}

  double real(std::string_view f, Column c) const {
    double v = 0;
    auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
    if (ec != std::errc() || p != f.data() + f.size() || f.empty())
      fail(source_, line_, kColumnNames[c], quoted(f) + " is not a number");
    if (std::isnan(v)) fail(source_, line_, kColumnNames[c], "NaN");
    if (!std::isfinite(v)) fail(source_, line_, kColumnNames[c], quoted(f) + " is not finite");
    return v;
  }

  int64_t integer(std::string_view f, Column c) const {
    // Fast path: an optional minus and up to 18 digits.
    const char* b = f.data();
    const char* e = b + f.size();
    bool negative = b != e && *b == '-';
    b += negative;
    if (b != e && e - b <= 18) {
      int64_t v = 0;
      const char* q = b;
      for (; q != e && static_cast<unsigned>(*q - '0') < 10; ++q) v = v * 10 + (*q - '0');
      if (q == e) return negative ? -v : v;
    }
    int64_t v = 0;
    auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
    if (ec == std::errc() && p == f.data() + f.size() && !f.empty()) return v;
    // Integer columns written by float-typed writers ("3.0") are accepted when integral.
    double d = real(f, c);
    if (d != std::floor(d) || std::fabs(d) > 9e15)
      fail(source_, line_, kColumnNames[c], quoted(f) + " is not an integer");
    return static_cast<int64_t>(d);
  }

  int32_t int32(std::string_view f, Column c, int32_t min) const {
    int64_t v = integer(f, c);
    if (v < min || v > std::numeric_limits<int32_t>::max())
      fail(source_, line_, kColumnNames[c], std::to_string(v) + " is out of range");
    return static_cast<int32_t>(v);
  }

  // mc, mb_id and gmc are nullable in the artifact: empty means -1.
  int32_t optional_int32(std::string_view f, Column c) const { return f.empty() ? -1 : int32(f, c, -1); }

 private:
  const std::string& source_;
  size_t line_;
};

std::string_view trim_cr(std::string_view s) {
  if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
  return s;
}

std::vector<Column> parse_header(std::string_view header, const std::string& source) {
  std::vector<Column> columns;
  std::array<bool, kColumnNames.size()> seen{};
  size_t begin = 0;
  for (;;) {
    size_t end = header.find(',', begin);
    std::string_view name = header.substr(begin, end == std::string_view::npos ? end : end - begin);
    Column col = kIgnored;
    for (size_t i = 0; i < kColumnNames.size(); ++i) {
      if (kColumnNames[i] == name) col = static_cast<Column>(i);
    }
    if (col != kIgnored) {
      if (seen[col]) fail(source, 1, name, "appears twice in the header");
      seen[col] = true;
    }
    columns.push_back(col);
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
  for (size_t i = 0; i < kColumnNames.size(); ++i) {
    if (!seen[i]) fail(source, 1, kColumnNames[i], "missing from the header");
  }
  return columns;
}

}  // namespace

std::string Trace::where(size_t row) const {
  if (row < lines.size()) return source + ":" + std::to_string(lines[row]);
  const TraceRow& r = rows[row];
  return source + " (rank " + std::to_string(r.rank) + ", step " + std::to_string(r.step) + ", " +
         std::string(optype_name(r.optype)) + " " + std::to_string(r.seq_id) + ")";
}

Trace parse_trace_csv(std::string_view text, const std::string& source) {
  Trace t;
  t.source = source;
  size_t eol = text.find('\n');
  std::string_view header = trim_cr(text.substr(0, eol));
  if (header.empty()) fail(source, 1, "", "empty file: expected a header line naming the columns");
  const std::vector<Column> columns = parse_header(header, source);

  t.rows.reserve(text.size() / 72);
  t.lines.reserve(text.size() / 72);
  size_t line = 1;
  size_t pos = eol == std::string_view::npos ? text.size() : eol + 1;
  while (pos < text.size()) {
    ++line;
    const char* nl = static_cast<const char*>(std::memchr(text.data() + pos, '\n', text.size() - pos));
    size_t end = nl ? static_cast<size_t>(nl - text.data()) : text.size();
    std::string_view ln = trim_cr(text.substr(pos, end - pos));
    pos = end + 1;
    if (ln.empty()) continue;

    FieldParser parse(source, line);
    TraceRow r;
    size_t begin = 0;
    for (size_t i = 0; i < columns.size(); ++i) {
      size_t comma = ln.find(',', begin);
      bool last = i + 1 == columns.size();
      if (!last && comma == std::string_view::npos) {
        Column missing = columns[i + 1];
        fail(source, line, missing == kIgnored ? "" : kColumnNames[missing],
             "line has " + std::to_string(i + 1) + " fields, the header " + std::to_string(columns.size()));
      }
      if (last && comma != std::string_view::npos)
        fail(source, line, "", "line has more fields than the header's " + std::to_string(columns.size()));
      std::string_view f = ln.substr(begin, last ? std::string_view::npos : comma - begin);
      begin = comma + 1;
      switch (columns[i]) {
        case kDpRank:
          r.dp_rank = parse.int32(f, kDpRank, 0);
          break;
        case kStage:
          r.stage = parse.int32(f, kStage, 0);
          break;
        case kRank:
          r.rank = parse.int32(f, kRank, 0);
          break;
        case kStep:
          r.step = parse.integer(f, kStep);
          break;
        case kOptype: {
          auto type = parse_optype(f);
          if (!type) {
            std::string hint;
            if (f == "forward-pp-comm" || f == "backward-pp-comm")
              hint = " (a report group: the trace must record forward-send/forward-recv/backward-send/backward-recv)";
            fail(source, line, "optype", "unknown op type " + quoted(f) + hint);
          }
          r.optype = *type;
          break;
        }
        case kStart:
          r.start = parse.real(f, kStart);
          break;
        case kDuration:
          r.duration = parse.real(f, kDuration);
          if (r.duration < 0) fail(source, line, "duration", "negative duration " + std::string(f));
          break;
        case kSeqId:
          r.seq_id = parse.int32(f, kSeqId, 0);
          break;
        case kMc:
          r.mc = parse.optional_int32(f, kMc);
          break;
        case kMbId:
          r.mb_id = parse.optional_int32(f, kMbId);
          break;
        case kGmc:
          r.gmc = parse.optional_int32(f, kGmc);
          break;
        case kIgnored:
          break;
      }
    }
    t.rows.push_back(r);
    t.lines.push_back(static_cast<uint32_t>(line));
  }
  if (t.rows.empty()) fail(source, 1, "", "no operations after the header");
  // The analysis keeps a cell per (dp_rank, stage): bound their product
  // here, naming the row that makes it too large, before anything allocates.
  size_t widest_dp = 0, deepest_stage = 0;
  for (size_t i = 0; i < t.rows.size(); ++i) {
    if (t.rows[i].dp_rank > t.rows[widest_dp].dp_rank) widest_dp = i;
    if (t.rows[i].stage > t.rows[deepest_stage].stage) deepest_stage = i;
  }
  const uint64_t dp = uint64_t(t.rows[widest_dp].dp_rank) + 1, pp = uint64_t(t.rows[deepest_stage].stage) + 1;
  if (dp * pp > kMaxGridCells) {
    const size_t row = dp >= pp ? widest_dp : deepest_stage;
    fail(source, int(t.lines[row]), dp >= pp ? "dp_rank" : "stage",
         "dp_rank up to " + std::to_string(dp - 1) + " and stage up to " + std::to_string(pp - 1) + " make " +
             std::to_string(dp) + " x " + std::to_string(pp) + " data-parallel ranks and stages, more than " +
             std::to_string(kMaxGridCells) + " in all");
  }
  return t;
}

Trace read_trace(const std::string& path) {
  Buffer data = read_file(path);
  if (util::is_gzip(data.data(), data.size())) return parse_trace_csv(gunzip(data, path).view(), path);
  return parse_trace_csv(data.view(), path);
}

}  // namespace ballast::straggler
