#include "lua_json.hpp"

#include "lua_sandbox.hpp"

#include <climits>
#include <cmath>
#include <new>

namespace ballast {

namespace {

// Walks a Lua value depth-first with raw access; `path` names where it is
// for messages, `ancestors` are the stack slots of the tables being walked.
class Walker {
 public:
  Walker(lua_State* L, const std::string& root, const JsonLimits& limits)
      : L_(L), root_(root), limits_(limits) {}

  bool value(int idx, nlohmann::json* out) {
    if (++values_ > limits_.max_values) {
      return fail("more than " + std::to_string(limits_.max_values) + " values");
    }
    switch (lua_type(L_, idx)) {
      case LUA_TNIL: *out = nullptr; return true;
      case LUA_TBOOLEAN: *out = lua_toboolean(L_, idx) != 0; return true;
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
      case LUA_TTABLE: return table(idx, out);
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
        std::string key = kt == LUA_TNUMBER ? std::to_string(lua_tonumber(L_, -2))
                                            : std::string("of type ") + luaL_typename(L_, -2);
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

bool lua_to_json(lua_State* L, int idx, const std::string& root, const JsonLimits& limits,
                 nlohmann::json* out, std::string* error) {
  int top = lua_gettop(L);
  idx = lua_absindex(L, idx);
  bool ok = false;
  try {
    Walker walker(L, root, limits);
    ok = walker.value(idx, out);
    if (!ok && error != nullptr) *error = walker.error();
  } catch (const std::exception& e) {
    if (error != nullptr) *error = std::string("out of memory converting to JSON: ") + e.what();
    ok = false;
  }
  lua_settop(L, top);
  return ok;
}

// ---- JSON text -> tape ------------------------------------------------------

struct JsonTape::Sax {
  using json = nlohmann::json;

  JsonTape* tape;
  std::string* error;
  std::vector<size_t> open;  // tokens_ indices of the containers being filled

  void counted() {
    if (!open.empty() && tape->tokens_[open.back()].kind == kArray) ++tape->tokens_[open.back()].count;
  }
  bool add(Kind kind) {
    counted();
    Token t{};
    t.kind = kind;
    tape->tokens_.push_back(t);
    return true;
  }
  bool add_text(const std::string& s) {
    if (tape->chars_.size() + s.size() > UINT32_MAX) {
      *error = "JSON text too large";
      return false;
    }
    Token t{};
    t.kind = kString;
    t.text.offset = uint32_t(tape->chars_.size());
    t.text.length = uint32_t(s.size());
    tape->chars_ += s;
    tape->tokens_.push_back(t);
    return true;
  }
  bool begin(Kind kind) {
    if (open.size() >= kMaxDepth) {
      *error = "JSON nested deeper than " + std::to_string(kMaxDepth) + " levels";
      return false;
    }
    counted();
    open.push_back(tape->tokens_.size());
    Token t{};
    t.kind = kind;
    tape->tokens_.push_back(t);
    return true;
  }

  bool null() { return add(kNull); }
  bool boolean(bool v) { return add(v ? kTrue : kFalse); }
  bool number_integer(json::number_integer_t v) {
    add(kInteger);
    tape->tokens_.back().integer = v;
    return true;
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (v > uint64_t(INT64_MAX)) return number_float(double(v), {});
    return number_integer(int64_t(v));
  }
  bool number_float(json::number_float_t v, const json::string_t&) {
    add(kFloat);
    tape->tokens_.back().number = v;
    return true;
  }
  bool string(json::string_t& v) {
    counted();
    return add_text(v);
  }
  bool binary(json::binary_t&) {
    *error = "binary values are not JSON";
    return false;
  }
  bool start_object(std::size_t) { return begin(kObject); }
  bool key(json::string_t& v) {
    ++tape->tokens_[open.back()].count;
    return add_text(v);
  }
  bool end_object() {
    open.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return begin(kArray); }
  bool end_array() {
    open.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    *error = e.what();
    return false;
  }
};

void JsonTape::clear() {
  tokens_.clear();
  chars_.clear();
}

int JsonTape::parse(std::string_view text, std::string* error) {
  size_t root = tokens_.size();
  std::string why;
  bool ok = false;
  try {
    Sax sax{this, &why, {}};
    ok = nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &sax);
  } catch (const std::exception& e) {
    why = e.what();
    ok = false;
  }
  if (!ok || root > size_t(INT_MAX)) {
    tokens_.resize(root);
    if (error != nullptr) *error = why.empty() ? "invalid JSON" : why;
    return -1;
  }
  return int(root);
}

size_t JsonTape::push_value(lua_State* L, size_t i) const {
  const Token& t = tokens_[i];
  switch (t.kind) {
    case kNull: LuaSandbox::push_null(L); return i + 1;
    case kFalse: lua_pushboolean(L, 0); return i + 1;
    case kTrue: lua_pushboolean(L, 1); return i + 1;
    case kInteger: lua_pushinteger(L, lua_Integer(t.integer)); return i + 1;
    case kFloat: lua_pushnumber(L, t.number); return i + 1;
    case kString: lua_pushlstring(L, chars_.data() + t.text.offset, t.text.length); return i + 1;
    case kObject: {
      lua_createtable(L, 0, int(std::min<uint32_t>(t.count, INT_MAX)));
      size_t j = i + 1;
      for (uint32_t c = 0; c < t.count; ++c) {
        const Token& key = tokens_[j];
        lua_pushlstring(L, chars_.data() + key.text.offset, key.text.length);
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

void JsonTape::push(lua_State* L, int root) const {
  luaL_checkstack(L, int(2 * kMaxDepth + 8), "JSON to Lua");
  push_value(L, size_t(root));
}

}  // namespace ballast
