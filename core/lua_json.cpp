#include "lua_json.hpp"

#include "lua_sandbox.hpp"
#include "utf8.hpp"

#include <array>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <new>

namespace ballast {

namespace {

// Walks a Lua value depth-first with raw access; `path` names where it is
// for messages, `ancestors` are the stack slots of the tables being walked.
class Walker {
 public:
  Walker(lua_State* L, const std::string& root, const JsonLimits& limits) : L_(L), root_(root), limits_(limits) {
    if (limits.shared != nullptr) {
      values_ = limits.shared->values;
      bytes_ = limits.shared->bytes;
    }
  }
  void used(JsonUsage* usage) const {
    usage->values = values_;
    usage->bytes = bytes_;
  }

  bool value(int idx, nlohmann::json* out) {
    if (++values_ > limits_.max_values) {
      return fail("more than " + std::to_string(limits_.max_values) + " values");
    }
    switch (lua_type(L_, idx)) {
      case LUA_TNIL:
        *out = nullptr;
        return true;
      case LUA_TBOOLEAN:
        *out = lua_toboolean(L_, idx) != 0;
        return true;
      case LUA_TNUMBER: {
        if (lua_isinteger(L_, idx)) {
          *out = int64_t(lua_tointeger(L_, idx));
          return true;
        }
        double d = lua_tonumber(L_, idx);
        if (!std::isfinite(d)) return fail("not a finite number");
        *out = d;
        return true;
      }
      case LUA_TSTRING: {
        size_t len = 0;
        const char* s = lua_tolstring(L_, idx, &len);
        if (!count_bytes(len)) return false;
        *out = std::string(s, len);
        return true;
      }
      case LUA_TLIGHTUSERDATA:
        if (LuaSandbox::is_null(L_, idx)) {
          *out = nullptr;
          return true;
        }
        return fail("a light userdata cannot be converted");
      case LUA_TTABLE:
        return table(idx, out);
      default:
        return fail(std::string("a ") + luaL_typename(L_, idx) + " cannot be converted");
    }
  }

  const std::string& error() const { return error_; }

 private:
  struct Step {
    bool is_index;
    lua_Integer index;
    std::string_view key;  // points into a Lua string kept on the stack
  };

  bool count_bytes(size_t len) {
    bytes_ += len;
    if (bytes_ > limits_.max_bytes) {
      return fail("more than " + std::to_string(limits_.max_bytes) + " bytes of strings");
    }
    return true;
  }

  bool fail(const std::string& why) {
    std::string where = root_;
    for (const Step& s : path_) {
      if (s.is_index) {
        where += "[" + std::to_string(s.index) + "]";
      } else {
        if (!where.empty()) where += ".";
        where += s.key;
      }
    }
    error_ = (where.empty() ? std::string("the top-level value") : "'" + where + "'") + ": " + why;
    return false;
  }

  bool table(int idx, nlohmann::json* out) {
    idx = lua_absindex(L_, idx);
    if (ancestors_.size() >= limits_.max_depth) {
      return fail("tables nested deeper than " + std::to_string(limits_.max_depth));
    }
    for (int a : ancestors_) {
      if (lua_rawequal(L_, a, idx)) return fail("a cycle: the table contains itself");
    }
    if (!lua_checkstack(L_, 4)) return fail("tables nested too deep for the Lua stack");
    ancestors_.push_back(idx);

    // First pass: which keys are there.
    size_t n_int = 0, n_str = 0;
    lua_Integer max_int = 0;
    lua_pushnil(L_);
    while (lua_next(L_, idx) != 0) {
      int kt = lua_type(L_, -2);
      if (kt == LUA_TNUMBER && lua_isinteger(L_, -2) && lua_tointeger(L_, -2) >= 1) {
        ++n_int;
        max_int = std::max(max_int, lua_tointeger(L_, -2));
      } else if (kt == LUA_TSTRING) {
        ++n_str;
      } else {
        std::string key =
            kt == LUA_TNUMBER ? std::to_string(lua_tonumber(L_, -2)) : std::string("of type ") + luaL_typename(L_, -2);
        lua_pop(L_, 2);
        return fail("key " + key + " is neither a string nor a positive integer");
      }
      lua_pop(L_, 1);
    }
    if (n_int > 0 && n_str > 0) return fail("a table mixes list elements and string keys");

    if (n_int > 0) {
      if (lua_Integer(n_int) != max_int) {
        return fail("a list with holes (" + std::to_string(n_int) + " elements, largest index " +
                    std::to_string(max_int) + ")");
      }
      *out = nlohmann::json::array();
      for (lua_Integer i = 1; i <= max_int; ++i) {
        lua_rawgeti(L_, idx, i);
        path_.push_back(Step{true, i, {}});
        nlohmann::json element;
        bool ok = value(-1, &element);
        lua_pop(L_, 1);
        if (!ok) return false;
        path_.pop_back();
        out->push_back(std::move(element));
      }
    } else {
      *out = nlohmann::json::object();
      lua_pushnil(L_);
      while (lua_next(L_, idx) != 0) {
        size_t len = 0;
        const char* k = lua_tolstring(L_, -2, &len);  // a string: no conversion
        if (!count_bytes(len)) return false;
        path_.push_back(Step{false, 0, std::string_view(k, len)});
        nlohmann::json& slot = (*out)[std::string(k, len)];
        if (!value(-1, &slot)) return false;
        path_.pop_back();
        lua_pop(L_, 1);
      }
    }
    ancestors_.pop_back();
    return true;
  }

  lua_State* L_;
  const std::string& root_;
  const JsonLimits& limits_;
  size_t values_ = 0;
  size_t bytes_ = 0;
  std::vector<Step> path_;
  std::vector<int> ancestors_;
  std::string error_;
};

}  // namespace

bool lua_to_json(lua_State* L, int idx, const std::string& root, const JsonLimits& limits, nlohmann::json* out,
                 std::string* error) {
  int top = lua_gettop(L);
  idx = lua_absindex(L, idx);
  bool ok = false;
  try {
    Walker walker(L, root, limits);
    ok = walker.value(idx, out);
    if (!ok && error != nullptr) *error = walker.error();
    if (limits.shared != nullptr) walker.used(limits.shared);
  } catch (const std::exception& e) {
    if (error != nullptr) *error = std::string("out of memory converting to JSON: ") + e.what();
    ok = false;
  }
  lua_settop(L, top);
  return ok;
}

// ---- JSON text -> tape ------------------------------------------------------

namespace {

// The string bytes the parser keeps without a second look: printable ASCII
// but the quote and the backslash.
constexpr std::array<bool, 256> kPlainAscii = [] {
  std::array<bool, 256> t{};
  for (int c = 0x20; c < 0x80; ++c) t[c] = c != '"' && c != '\\';
  return t;
}();

}  // namespace

struct JsonTape::Parser {
  JsonTape& tape;
  const char* begin;
  const char* p;
  const char* end;
  std::string* error;

  bool fail(const char* what) {
    int line = 1, column = 1;
    for (const char* q = begin; q < p; ++q) {
      if (*q == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    if (error != nullptr) {
      *error = std::string("JSON: ") + what + " at line " + std::to_string(line) + ", column " + std::to_string(column);
    }
    return false;
  }

  void skip_space() {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) ++p;
  }

  bool push(Kind kind) {
    Token t{};
    t.kind = kind;
    tape.add(t);
    return true;
  }

  bool value(size_t depth) {
    skip_space();
    if (p == end) return fail("unexpected end");
    switch (*p) {
      case '{':
        return container(depth, kObject, '}');
      case '[':
        return container(depth, kArray, ']');
      case '"':
        return string();
      case 't':
        return literal("true", kTrue);
      case 'f':
        return literal("false", kFalse);
      case 'n':
        return literal("null", kNull);
      default:
        return number();
    }
  }

  bool literal(const char* word, Kind kind) {
    size_t n = std::strlen(word);
    if (size_t(end - p) < n || std::memcmp(p, word, n) != 0) return fail("invalid literal");
    p += n;
    return push(kind);
  }

  // An object is (key string, value) pairs; an array values.
  bool container(size_t depth, Kind kind, char close) {
    if (depth >= kMaxDepth) return fail("nested deeper than 64 levels");
    size_t at = tape.count_;
    push(kind);
    ++p;
    skip_space();
    if (p < end && *p == close) {
      ++p;
      return true;
    }
    for (;;) {
      if (kind == kObject) {
        skip_space();
        if (p == end || *p != '"') return fail("expected a string key");
        if (!string()) return false;
        skip_space();
        if (p == end || *p != ':') return fail("expected ':'");
        ++p;
      }
      if (!value(depth + 1)) return false;
      ++tape.tokens_[at].count;
      skip_space();
      if (p < end && *p == ',') {
        ++p;
        continue;
      }
      if (p < end && *p == close) {
        ++p;
        return true;
      }
      return fail(kind == kObject ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  }

  bool hex4(uint32_t* out) {
    if (end - p < 4) return fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = *p++;
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= uint32_t(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= uint32_t(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= uint32_t(c - 'A' + 10);
      } else {
        return fail("invalid \\u escape");
      }
    }
    *out = v;
    return true;
  }

  void utf8(uint32_t cp) {
    std::string& s = tape.chars_;
    if (cp < 0x80) {
      s += char(cp);
    } else if (cp < 0x800) {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += char(0xE0 | (cp >> 12));
      s += char(0x80 | ((cp >> 6) & 0x3F));
      s += char(0x80 | (cp & 0x3F));
    } else {
      s += char(0xF0 | (cp >> 18));
      s += char(0x80 | ((cp >> 12) & 0x3F));
      s += char(0x80 | ((cp >> 6) & 0x3F));
      s += char(0x80 | (cp & 0x3F));
    }
  }

  // Moves p past the bytes a string keeps as they are: printable ASCII
  // and valid UTF-8 sequences. Stops at a quote, a backslash, a control
  // character or the end; fails at an invalid UTF-8 sequence.
  bool plain_run() {
    for (;;) {
      // One table look-up a byte, on a local pointer the compiler keeps in
      // a register: cheaper than the comparisons were before UTF-8 was
      // checked.
      const char* q = p;
      while (q < end && kPlainAscii[static_cast<unsigned char>(*q)]) ++q;
      p = q;
      if (p == end || static_cast<unsigned char>(*p) < 0x80) return true;
      const char* why = nullptr;
      size_t n = util::utf8_sequence(p, end, &why);
      if (n == 0) return fail((std::string("invalid UTF-8 (") + why + ")").c_str());
      p += n;
    }
  }

  bool string() {  // at the opening quote
    ++p;
    const char* run = p;
    if (!plain_run()) return false;
    if (p < end && *p == '"') {  // no escape: a view of the text
      if (size_t(p - run) > UINT32_MAX) return fail("text too large");
      Token t{};
      t.kind = kView;
      t.view.data = run;
      t.view.length = uint32_t(p - run);
      tape.add(t);
      ++p;
      return true;
    }
    std::string& s = tape.chars_;
    size_t start = s.size();
    for (;;) {
      s.append(run, size_t(p - run));
      if (p == end) return fail("unterminated string");
      if (*p == '"') {
        ++p;
        break;
      }
      if (*p != '\\') return fail("control character in a string");
      if (++p == end) return fail("unterminated string");
      switch (*p++) {
        case '"':
          s += '"';
          break;
        case '\\':
          s += '\\';
          break;
        case '/':
          s += '/';
          break;
        case 'b':
          s += '\b';
          break;
        case 'f':
          s += '\f';
          break;
        case 'n':
          s += '\n';
          break;
        case 'r':
          s += '\r';
          break;
        case 't':
          s += '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(&cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t lo = 0;
            if (end - p < 2 || p[0] != '\\' || p[1] != 'u') return fail("unpaired surrogate");
            p += 2;
            if (!hex4(&lo)) return false;
            if (lo < 0xDC00 || lo > 0xDFFF) return fail("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return fail("unpaired surrogate");
          }
          utf8(cp);
          break;
        }
        default:
          --p;
          return fail("invalid escape");
      }
      run = p;
      if (!plain_run()) return false;
    }
    if (s.size() > UINT32_MAX) return fail("text too large");
    Token t{};
    t.kind = kString;
    t.text.offset = uint32_t(start);
    t.text.length = uint32_t(s.size() - start);
    tape.add(t);
    return true;
  }

  bool digits() {
    if (p == end || *p < '0' || *p > '9') return fail("invalid number");
    while (p < end && *p >= '0' && *p <= '9') ++p;
    return true;
  }

  bool number() {
    const char* s = p;
    if (*p == '-') ++p;
    if (p == end || *p < '0' || *p > '9') return fail("invalid value");
    if (*p == '0') {
      ++p;
    } else if (!digits()) {
      return false;
    }
    bool is_float = false;
    if (p < end && *p == '.') {
      is_float = true;
      ++p;
      if (!digits()) return false;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
      is_float = true;
      ++p;
      if (p < end && (*p == '+' || *p == '-')) ++p;
      if (!digits()) return false;
    }
    Token t{};
    if (!is_float) {
      int64_t v = 0;
      auto r = std::from_chars(s, p, v);
      if (r.ec == std::errc() && r.ptr == p) {
        t.kind = kInteger;
        t.integer = v;
        tape.add(t);
        return true;
      }  // too large for an integer: a float
    }
    double d = 0;
    auto r = std::from_chars(s, p, d);
    if (r.ec != std::errc() || r.ptr != p) return fail("number out of range");
    t.kind = kFloat;
    t.number = d;
    tape.add(t);
    return true;
  }
};

void JsonTape::clear() {
  count_ = 0;
  chars_.clear();
}

int JsonTape::parse(std::string_view text, std::string* error) {
  size_t root = count_;
  size_t chars = chars_.size();
  bool ok = false;
  try {
    Parser parser{*this, text.data(), text.data(), text.data() + text.size(), error};
    ok = parser.value(0);
    if (ok) {
      parser.skip_space();
      if (parser.p != parser.end) ok = parser.fail("unexpected text after the value");
    }
  } catch (const std::exception& e) {
    if (error != nullptr) *error = std::string("JSON: ") + e.what();
    ok = false;
  }
  if (!ok || root > size_t(INT_MAX)) {
    count_ = root;
    chars_.resize(chars);
    return -1;
  }
  return int(root);
}

size_t JsonTape::push_value(lua_State* L, size_t i) const {
  const Token& t = tokens_[i];
  switch (t.kind) {
    case kNull:
      LuaSandbox::push_null(L);
      return i + 1;
    case kFalse:
      lua_pushboolean(L, 0);
      return i + 1;
    case kTrue:
      lua_pushboolean(L, 1);
      return i + 1;
    case kInteger:
      lua_pushinteger(L, lua_Integer(t.integer));
      return i + 1;
    case kFloat:
      lua_pushnumber(L, t.number);
      return i + 1;
    case kString:
    case kView:
      push_string(L, t);
      return i + 1;
    case kObject: {
      lua_createtable(L, 0, int(std::min<uint32_t>(t.count, INT_MAX)));
      size_t j = i + 1;
      for (uint32_t c = 0; c < t.count; ++c) {
        const Token& key = tokens_[j];
        push_string(L, key);
        j = push_value(L, j + 1);
        lua_rawset(L, -3);
      }
      return j;
    }
    case kArray: {
      lua_createtable(L, int(std::min<uint32_t>(t.count, INT_MAX)), 0);
      size_t j = i + 1;
      for (uint32_t c = 0; c < t.count; ++c) {
        j = push_value(L, j);
        lua_rawseti(L, -2, lua_Integer(c) + 1);
      }
      return j;
    }
  }
  lua_pushnil(L);
  return i + 1;
}

void JsonTape::push_string(lua_State* L, const Token& t) const {
  if (t.kind == kView) {
    lua_pushlstring(L, t.view.data, t.view.length);
  } else {
    lua_pushlstring(L, chars_.data() + t.text.offset, t.text.length);
  }
}

void JsonTape::push(lua_State* L, int root) const {
  luaL_checkstack(L, int(2 * kMaxDepth + 8), "JSON to Lua");
  push_value(L, size_t(root));
}

}  // namespace ballast
