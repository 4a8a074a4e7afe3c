#include "lua_pattern.hpp"

#include "lua_sandbox.hpp"

#include <cctype>
#include <cstddef>
#include <cstring>

// Everything here may raise Lua errors (longjmp): no object with a
// destructor lives in these frames.

namespace ballast {

namespace {

constexpr int kMaxCaptures = 32;  // Lua's LUA_MAXCAPTURES
constexpr int kMaxDepth = 200;    // Lua's MAXCCALLS for a match
constexpr size_t kCheckEvery = 4096;
constexpr ptrdiff_t kUnfinished = -1;  // capture length while open
constexpr ptrdiff_t kPosition = -2;    // "()": a position capture

unsigned char uc(char c) { return static_cast<unsigned char>(c); }

// %a, %d, ... (upper case: the complement); any other character stands for
// itself.
bool class_matches(unsigned char c, unsigned char cl) {
  bool in;
  switch (std::tolower(cl)) {
    case 'a':
      in = std::isalpha(c);
      break;
    case 'c':
      in = std::iscntrl(c);
      break;
    case 'd':
      in = std::isdigit(c);
      break;
    case 'g':
      in = std::isgraph(c);
      break;
    case 'l':
      in = std::islower(c);
      break;
    case 'p':
      in = std::ispunct(c);
      break;
    case 's':
      in = std::isspace(c);
      break;
    case 'u':
      in = std::isupper(c);
      break;
    case 'w':
      in = std::isalnum(c);
      break;
    case 'x':
      in = std::isxdigit(c);
      break;
    case 'z':
      in = c == 0;
      break;  // deprecated in Lua 5.2, still there in 5.4
    default:
      return cl == c;
  }
  return std::isupper(cl) ? !in : in;
}

// c against the set from '[' at `open` to its ']' at `close`.
bool set_matches(unsigned char c, const char* open, const char* close) {
  const char* p = open + 1;
  bool in = true;
  if (*p == '^') {
    in = false;
    ++p;
  }
  for (; p < close; ++p) {
    if (*p == '%') {
      ++p;
      if (class_matches(c, uc(*p))) return in;
    } else if (p[1] == '-' && p + 2 < close) {
      if (uc(p[0]) <= c && c <= uc(p[2])) return in;
      p += 2;
    } else if (uc(*p) == c) {
      return in;
    }
  }
  return !in;
}

struct Matcher {
  lua_State* L;
  const char* what;  // "string.find", ... for the deadline's message
  const char* subject;
  const char* subject_end;
  const char* pattern_end;
  int depth;
  int level;  // captures opened
  size_t until_check;
  struct {
    const char* start;
    ptrdiff_t len;
  } capture[kMaxCaptures];

  void init(lua_State* l, const char* fn, const char* s, size_t ls, const char* p, size_t lp) {
    L = l;
    what = fn;
    subject = s;
    subject_end = s + ls;
    pattern_end = p + lp;
    until_check = kCheckEvery;
    reset();
  }
  void reset() {
    depth = 0;
    level = 0;
  }

  // Count n steps; every kCheckEvery, stop here if the call is past its deadline.
  void work(size_t n = 1) {
    if (n < until_check) {
      until_check -= n;
      return;
    }
    until_check = kCheckEvery;
    LuaSandbox::check_deadline(L, what);
  }

  // Past the single-character class at p (p < pattern_end).
  const char* class_end(const char* p) {
    char c = *p++;
    if (c == '%') {
      if (p == pattern_end) luaL_error(L, "malformed pattern (ends with '%%')");
      return p + 1;
    }
    if (c == '[') {
      if (p < pattern_end && *p == '^') ++p;
      do {  // the set's first character never closes it
        if (p == pattern_end) luaL_error(L, "malformed pattern (missing ']')");
        if (*p++ == '%' && p < pattern_end) ++p;
      } while (p == pattern_end || *p != ']');
      return p + 1;
    }
    return p;
  }

  bool single(const char* s, const char* p, const char* ep) const {
    if (s >= subject_end) return false;
    switch (*p) {
      case '.':
        return true;
      case '%':
        return class_matches(uc(*s), uc(p[1]));
      case '[':
        return set_matches(uc(*s), p, ep - 1);
      default:
        return *p == *s;
    }
  }

  const char* match(const char* s, const char* p) {
    if (++depth > kMaxDepth) luaL_error(L, "pattern too complex");
    const char* r = match_here(s, p);
    --depth;
    return r;
  }

  const char* match_here(const char* s, const char* p) {
    while (p != pattern_end) {
      work();
      switch (*p) {
        case '(':
          if (p + 1 < pattern_end && p[1] == ')') return open_capture(s, p + 2, kPosition);
          return open_capture(s, p + 1, kUnfinished);
        case ')':
          return close_capture(s, p + 1);
        case '$':
          if (p + 1 == pattern_end) return s == subject_end ? s : nullptr;
          break;  // a '$' elsewhere is itself
        case '%':
          if (p + 1 == pattern_end) break;  // class_end reports it
          if (p[1] == 'b') {
            s = balance(s, p + 2);
            if (s == nullptr) return nullptr;
            p += 4;
            continue;
          }
          if (p[1] == 'f') {
            p += 2;
            if (p == pattern_end || *p != '[') luaL_error(L, "missing '[' after '%%f' in pattern");
            const char* ep = class_end(p);
            unsigned char before = s == subject ? 0 : uc(s[-1]);
            unsigned char here = s < subject_end ? uc(*s) : 0;
            if (set_matches(before, p, ep - 1) || !set_matches(here, p, ep - 1)) return nullptr;
            p = ep;
            continue;
          }
          if (std::isdigit(uc(p[1]))) {
            s = back_reference(s, p[1]);
            if (s == nullptr) return nullptr;
            p += 2;
            continue;
          }
          break;
        default:
          break;
      }
      const char* ep = class_end(p);
      char repeat = ep < pattern_end ? *ep : '\0';
      if (repeat == '?') {
        if (single(s, p, ep)) {
          if (const char* r = match(s + 1, ep + 1)) return r;
        }
        p = ep + 1;
        continue;
      }
      if (repeat == '+') return single(s, p, ep) ? longest(s + 1, p, ep) : nullptr;
      if (repeat == '*') return longest(s, p, ep);
      if (repeat == '-') return shortest(s, p, ep);
      if (!single(s, p, ep)) return nullptr;
      ++s;
      p = ep;
    }
    return s;
  }

  // x*: as many as match, then give back one at a time.
  const char* longest(const char* s, const char* p, const char* ep) {
    size_t n = 0;
    while (single(s + n, p, ep)) {
      ++n;
      work();
    }
    for (;;) {
      if (const char* r = match(s + n, ep + 1)) return r;
      if (n == 0) return nullptr;
      --n;
    }
  }

  // x-: as few as the rest of the pattern allows.
  const char* shortest(const char* s, const char* p, const char* ep) {
    for (;;) {
      if (const char* r = match(s, ep + 1)) return r;
      if (!single(s, p, ep)) return nullptr;
      ++s;
    }
  }

  // %bxy at s; p points at x.
  const char* balance(const char* s, const char* p) {
    if (p + 1 >= pattern_end) luaL_error(L, "malformed pattern (missing arguments to '%%b')");
    if (s >= subject_end || *s != p[0]) return nullptr;
    ptrdiff_t open = 1;
    for (const char* t = s + 1; t < subject_end; ++t) {
      work();
      if (*t == p[1]) {
        if (--open == 0) return t + 1;
      } else if (*t == p[0]) {
        ++open;
      }
    }
    return nullptr;
  }

  int capture_index(char digit) {
    int i = digit - '1';
    if (i < 0 || i >= level || capture[i].len == kUnfinished) {
      luaL_error(L, "invalid capture index %%%d in pattern", i + 1);
    }
    return i;
  }

  const char* back_reference(const char* s, char digit) {
    int i = capture_index(digit);
    ptrdiff_t len = capture[i].len;
    if (len < 0) return nullptr;  // a position capture matches no text
    work(size_t(len));
    if (subject_end - s >= len && std::memcmp(capture[i].start, s, size_t(len)) == 0) return s + len;
    return nullptr;
  }

  const char* open_capture(const char* s, const char* p, ptrdiff_t kind) {
    if (level >= kMaxCaptures) luaL_error(L, "too many captures");
    capture[level].start = s;
    capture[level].len = kind;
    ++level;
    const char* r = match(s, p);
    if (r == nullptr) --level;
    return r;
  }

  const char* close_capture(const char* s, const char* p) {
    int i = level - 1;
    while (i >= 0 && capture[i].len != kUnfinished) --i;
    if (i < 0) luaL_error(L, "invalid pattern capture");
    capture[i].len = s - capture[i].start;
    const char* r = match(s, p);
    if (r == nullptr) capture[i].len = kUnfinished;
    return r;
  }

  // Capture i of the match [s, e); i == 0 of a pattern without captures is
  // the whole match.
  void push_capture(int i, const char* s, const char* e) {
    if (i >= level) {
      if (i != 0) luaL_error(L, "invalid capture index %%%d", i + 1);
      lua_pushlstring(L, s, size_t(e - s));
      return;
    }
    ptrdiff_t len = capture[i].len;
    if (len == kUnfinished) luaL_error(L, "unfinished capture");
    if (len == kPosition) {
      lua_pushinteger(L, lua_Integer(capture[i].start - subject) + 1);
    } else {
      lua_pushlstring(L, capture[i].start, size_t(len));
    }
  }

  // All captures; with none, the whole match unless s is null (find).
  int push_captures(const char* s, const char* e) {
    int n = (level == 0 && s != nullptr) ? 1 : level;
    luaL_checkstack(L, n, "too many captures");
    for (int i = 0; i < n; ++i) push_capture(i, s, e);
    return n;
  }
};

// Lua's rule for a start position: negative counts from the end, 0 is 1.
size_t start_index(lua_Integer pos, size_t len) {
  if (pos > 0) return size_t(pos);
  if (pos == 0 || pos < -lua_Integer(len)) return 1;
  return size_t(lua_Integer(len) + pos + 1);
}

bool has_specials(const char* p, size_t lp) {
  for (size_t i = 0; i < lp; ++i) {
    if (std::strchr("^$*+?.([%-", p[i]) != nullptr && p[i] != '\0') return true;
  }
  return false;
}

// The first occurrence of needle in [s, s + ls), counting compared bytes.
const char* plain_find(Matcher& m, const char* s, size_t ls, const char* needle, size_t ln) {
  if (ln == 0) return s;
  if (ln > ls) return nullptr;
  const char* last = s + (ls - ln);
  while (s <= last) {
    const void* at = std::memchr(s, needle[0], size_t(last - s) + 1);
    if (at == nullptr) return nullptr;
    const char* c = static_cast<const char*>(at);
    m.work(size_t(c - s) / 64 + ln);
    if (std::memcmp(c + 1, needle + 1, ln - 1) == 0) return c;
    s = c + 1;
  }
  return nullptr;
}

int find_or_match(lua_State* L, bool find) {
  size_t ls = 0, lp = 0;
  const char* s = luaL_checklstring(L, 1, &ls);
  const char* p = luaL_checklstring(L, 2, &lp);
  size_t init = start_index(luaL_optinteger(L, 3, 1), ls) - 1;
  if (init > ls) {
    luaL_pushfail(L);
    return 1;
  }
  Matcher m;
  if (find && (lua_toboolean(L, 4) || !has_specials(p, lp))) {
    m.init(L, "string.find", s, ls, p, lp);
    if (const char* at = plain_find(m, s + init, ls - init, p, lp)) {
      lua_pushinteger(L, lua_Integer(at - s) + 1);
      lua_pushinteger(L, lua_Integer(at - s) + lua_Integer(lp));
      return 2;
    }
    luaL_pushfail(L);
    return 1;
  }
  bool anchor = lp > 0 && p[0] == '^';
  if (anchor) {
    ++p;
    --lp;
  }
  m.init(L, find ? "string.find" : "string.match", s, ls, p, lp);
  const char* at = s + init;
  for (;;) {
    m.reset();
    if (const char* e = m.match(at, p)) {
      if (!find) return m.push_captures(at, e);
      lua_pushinteger(L, lua_Integer(at - s) + 1);
      lua_pushinteger(L, lua_Integer(e - s));
      return m.push_captures(nullptr, nullptr) + 2;
    }
    if (anchor || at == m.subject_end) break;
    ++at;
    m.work();
  }
  luaL_pushfail(L);
  return 1;
}

int bounded_find(lua_State* L) { return find_or_match(L, true); }
int bounded_match(lua_State* L) { return find_or_match(L, false); }

// The iterator gmatch returns; upvalues: subject, pattern, next start,
// end of the last match (-1: none yet).
int gmatch_next(lua_State* L) {
  size_t ls = 0, lp = 0;
  const char* s = lua_tolstring(L, lua_upvalueindex(1), &ls);
  const char* p = lua_tolstring(L, lua_upvalueindex(2), &lp);
  lua_Integer start = lua_tointeger(L, lua_upvalueindex(3));
  lua_Integer last = lua_tointeger(L, lua_upvalueindex(4));
  if (start > lua_Integer(ls)) return 0;
  Matcher m;
  m.init(L, "string.gmatch", s, ls, p, lp);
  for (const char* at = s + start;; ++at) {
    m.reset();
    const char* e = m.match(at, p);
    if (e != nullptr && e - s != last) {
      lua_pushinteger(L, e - s);
      lua_pushvalue(L, -1);
      lua_replace(L, lua_upvalueindex(3));
      lua_replace(L, lua_upvalueindex(4));
      return m.push_captures(at, e);
    }
    if (at == m.subject_end) break;
    m.work();
  }
  lua_pushinteger(L, lua_Integer(ls) + 1);
  lua_replace(L, lua_upvalueindex(3));
  return 0;
}

int bounded_gmatch(lua_State* L) {
  size_t ls = 0;
  luaL_checklstring(L, 1, &ls);
  luaL_checkstring(L, 2);
  size_t init = start_index(luaL_optinteger(L, 3, 1), ls) - 1;
  if (init > ls) init = ls + 1;
  lua_settop(L, 2);
  lua_pushinteger(L, lua_Integer(init));
  lua_pushinteger(L, -1);
  lua_pushcclosure(L, gmatch_next, 4);
  return 1;
}

// The replacement string (argument 3) with %0-%9 and %% expanded.
void add_replacement_string(Matcher& m, luaL_Buffer* b, const char* s, const char* e) {
  lua_State* L = m.L;
  size_t lr = 0;
  const char* r = lua_tolstring(L, 3, &lr);
  const char* end = r + lr;
  m.work(lr);
  for (;;) {
    const char* pct = static_cast<const char*>(std::memchr(r, '%', size_t(end - r)));
    if (pct == nullptr) break;
    luaL_addlstring(b, r, size_t(pct - r));
    r = pct + 1;
    char c = r < end ? *r : '\0';
    if (c == '%') {
      luaL_addchar(b, '%');
    } else if (c == '0') {
      luaL_addlstring(b, s, size_t(e - s));
      m.work(size_t(e - s));
    } else if (std::isdigit(uc(c))) {
      m.push_capture(c - '1', s, e);
      luaL_addvalue(b);
    } else {
      luaL_error(L, "invalid use of '%%' in replacement string");
    }
    ++r;
  }
  luaL_addlstring(b, r, size_t(end - r));
}

void add_replacement(Matcher& m, luaL_Buffer* b, const char* s, const char* e, int kind) {
  lua_State* L = m.L;
  if (kind == LUA_TFUNCTION) {
    lua_pushvalue(L, 3);
    int n = m.push_captures(s, e);
    lua_call(L, n, 1);
  } else if (kind == LUA_TTABLE) {
    m.push_capture(0, s, e);
    lua_gettable(L, 3);
  } else {
    add_replacement_string(m, b, s, e);
    return;
  }
  if (!lua_toboolean(L, -1)) {  // nil or false: the match stays
    lua_pop(L, 1);
    luaL_addlstring(b, s, size_t(e - s));
  } else if (!lua_isstring(L, -1)) {
    luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
  } else {
    luaL_addvalue(b);
  }
}

int bounded_gsub(lua_State* L) {
  size_t ls = 0, lp = 0;
  const char* s = luaL_checklstring(L, 1, &ls);
  const char* p = luaL_checklstring(L, 2, &lp);
  int kind = lua_type(L, 3);
  lua_Integer max = luaL_optinteger(L, 4, lua_Integer(ls) + 1);
  luaL_argexpected(L, kind == LUA_TNUMBER || kind == LUA_TSTRING || kind == LUA_TFUNCTION || kind == LUA_TTABLE, 3,
                   "string/function/table");
  bool anchor = lp > 0 && p[0] == '^';
  if (anchor) {
    ++p;
    --lp;
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  Matcher m;
  m.init(L, "string.gsub", s, ls, p, lp);
  const char* at = s;
  const char* last = nullptr;
  lua_Integer n = 0;
  while (n < max) {
    m.reset();
    const char* e = m.match(at, p);
    if (e != nullptr && e != last) {
      ++n;
      add_replacement(m, &b, at, e, kind);
      at = last = e;
    } else if (at < m.subject_end) {
      luaL_addchar(&b, *at++);
    } else {
      break;
    }
    if (anchor) break;
    m.work();
  }
  luaL_addlstring(&b, at, size_t(m.subject_end - at));
  luaL_pushresult(&b);
  lua_pushinteger(L, n);
  return 2;
}

}  // namespace

void install_bounded_patterns(lua_State* L, int string_lib) {
  string_lib = lua_absindex(L, string_lib);
  static const luaL_Reg kFunctions[] = {{"find", bounded_find},
                                        {"match", bounded_match},
                                        {"gmatch", bounded_gmatch},
                                        {"gsub", bounded_gsub},
                                        {nullptr, nullptr}};
  for (const luaL_Reg* f = kFunctions; f->name != nullptr; ++f) {
    lua_pushcfunction(L, f->func);
    lua_setfield(L, string_lib, f->name);
  }
}

}  // namespace ballast
