// JSON <-> Lua values, bounded both ways.
//
// Lua -> JSON (lua_to_json): sequences 1..n become arrays, tables with
// string keys objects, an empty table an empty object, ballast.null null.
// Functions, userdata, threads, non-finite numbers, mixed or sparse keys and
// cycles are errors that name the key path ("plugins[2].config.cb"). The walk
// uses raw access only (no metamethod runs, nothing is allocated in Lua), so
// it never raises a Lua error, and it stops at a depth, a number of values
// and a number of string bytes.
//
// JSON -> Lua (JsonTape): the text is parsed first, in C++, into a flat tape
// (no Lua call, so no longjmp can cross the parser); push() then builds the
// tables from the tape in a protected call. null becomes ballast.null. The
// parser is a small strict RFC 8259 one (nesting limited to 64 levels,
// strings valid UTF-8 up to U+10FFFF, an error naming the line and the
// column in bytes): this runs once per event, and a general-purpose parser
// cost more than the Lua call itself (nlohmann's SAX parser building the
// tables directly made a 5-field JSON event's call 1.8x slower, RapidJSON's
// SAX reader filling this tape 1.17x; checking UTF-8 as strings are scanned
// cost nothing measurable: docs/benchmarks.md, policy). Nor can a parser
// call Lua from its callbacks: a Lua error would longjmp across its C++
// frames.
#pragma once

#include <lua.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ballast {

// What the conversions sharing one budget have used (JsonLimits::shared).
struct JsonUsage {
  size_t values = 0;
  size_t bytes = 0;
};

struct JsonLimits {
  size_t max_depth = 64;
  size_t max_values = 100000;
  size_t max_bytes = 4u << 20;  // string bytes, keys included
  // When set, max_values and max_bytes bound the sum over every conversion
  // given this usage (e.g. all the outputs of one handler call).
  JsonUsage* shared = nullptr;
};

// Convert the value at `idx`. On failure *error is "<path>: <why>" (path
// starting with `root`, e.g. "args"). Never raises a Lua error.
bool lua_to_json(lua_State* L, int idx, const std::string& root, const JsonLimits& limits, nlohmann::json* out,
                 std::string* error);

// Parsed JSON values, ready to be pushed as Lua values. Reused across calls:
// clear() keeps the capacity.
class JsonTape {
 public:
  static constexpr size_t kMaxDepth = 64;

  void clear();
  // Parse `text` and append it; returns the root's index, or -1 with *error.
  // `text` must stay valid until clear(): strings without escapes are
  // pushed from it.
  int parse(std::string_view text, std::string* error);
  // Push the value whose root index is `root`. Allocates Lua objects: call
  // in protected mode. Needs kMaxDepth + 4 free stack slots.
  void push(lua_State* L, int root) const;

 private:
  // kString: text with escapes, decoded into chars_; kView: text without,
  // still in the parsed text (valid until clear(): the caller keeps it).
  enum Kind : uint8_t { kNull, kFalse, kTrue, kInteger, kFloat, kString, kView, kObject, kArray };
  struct Token {
    Kind kind;
    uint32_t count;  // kObject: members, kArray: elements
    union {
      int64_t integer;
      double number;
      struct {
        uint32_t offset, length;  // kString, in chars_
      } text;
      struct {
        const char* data;
        uint32_t length;  // kView
      } view;
    };
  };
  struct Parser;
  size_t push_value(lua_State* L, size_t i) const;
  void push_string(lua_State* L, const Token& t) const;

  // Append a token. The tape keeps its tokens between events, so that one
  // of the same shape costs no allocation.
  void add(const Token& t) {
    if (count_ == tokens_.size()) tokens_.resize(count_ < 16 ? 16 : 2 * count_);
    tokens_[count_++] = t;
  }

  std::vector<Token> tokens_;  // [0, count_): an object's members are (key string, value) pairs
  size_t count_ = 0;
  std::string chars_;
};

}  // namespace ballast
