#include "hostlist.hpp"

#include <algorithm>
#include <cctype>
#include <map>

namespace ballast::sched {
namespace {

// Split at commas that are outside brackets.
std::vector<std::string> split_top(const std::string& s) {
  std::vector<std::string> out;
  int depth = 0;
  std::string cur;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '[') {
      if (depth > 0) throw InputError("nested '[' at column " + std::to_string(i + 1) + " in hostlist \"" + s + "\"");
      ++depth;
    } else if (c == ']') {
      if (depth == 0)
        throw InputError("unmatched ']' at column " + std::to_string(i + 1) + " in hostlist \"" + s + "\"");
      --depth;
    }
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) throw InputError("unclosed '[' in hostlist \"" + s + "\"");
  out.push_back(cur);
  return out;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string pad(unsigned long long v, size_t width) {
  std::string d = std::to_string(v);
  if (d.size() < width) d.insert(0, width - d.size(), '0');
  return d;
}

// Values of one bracket body "001-003,7".
std::vector<std::string> bracket_values(const std::string& body, const std::string& expr, size_t limit) {
  std::vector<std::string> out;
  if (body.empty()) throw InputError("empty brackets in hostlist \"" + expr + "\"");
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    std::string item = body.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t dash = item.find('-');
    std::string lo = item.substr(0, dash);
    std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi))
      throw InputError("bad range \"" + item + "\" in hostlist \"" + expr + "\" (want N or N-M, digits only)");
    if (lo.size() > 18 || hi.size() > 18) throw InputError("number too long in hostlist \"" + expr + "\"");
    unsigned long long a = std::stoull(lo), b = std::stoull(hi);
    if (b < a) throw InputError("reversed range \"" + item + "\" in hostlist \"" + expr + "\"");
    if (b - a >= limit || out.size() + (b - a + 1) > limit)
      throw InputError(
          "hostlist \"" + expr + "\" expands to more than " + std::to_string(limit) + " names" +
          (limit < kMaxHostlistNames ? " (what is left of the file's " + std::to_string(kMaxHostlistNames) + ")" : ""));
    for (unsigned long long v = a; v <= b; ++v) out.push_back(pad(v, lo.size()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Expand one comma-free-at-top-level term: literal text and bracket groups.
void expand_term(const std::string& term, const std::string& expr, size_t limit, std::vector<std::string>& out) {
  std::vector<std::string> acc{""};
  size_t i = 0;
  while (i < term.size()) {
    size_t open = term.find('[', i);
    std::string lit = term.substr(i, open == std::string::npos ? std::string::npos : open - i);
    for (char c : lit)
      if (std::isspace(static_cast<unsigned char>(c)) || c == ']')
        throw InputError("unexpected '" + std::string(1, c) + "' in hostlist \"" + expr + "\"");
    for (auto& a : acc) a += lit;
    if (open == std::string::npos) break;
    size_t close = term.find(']', open);  // split_top guarantees it exists
    auto vals = bracket_values(term.substr(open + 1, close - open - 1), expr, limit);
    if (acc.size() * vals.size() > limit - std::min(limit, out.size()))
      throw InputError("hostlist \"" + expr + "\" expands to more than " + std::to_string(limit) + " names");
    std::vector<std::string> next;
    next.reserve(acc.size() * vals.size());
    for (auto& a : acc)
      for (auto& v : vals) next.push_back(a + v);
    acc.swap(next);
    i = close + 1;
  }
  for (auto& a : acc) out.push_back(std::move(a));
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& expr, size_t* budget) {
  std::vector<std::string> out;
  if (expr.empty()) return out;
  for (const auto& term : split_top(expr)) {
    if (term.empty()) throw InputError("empty name in hostlist \"" + expr + "\" (stray comma)");
    expand_term(term, expr, *budget, out);
  }
  *budget -= out.size();
  return out;
}

std::vector<std::string> expand_hostlist(const std::string& expr) {
  size_t budget = kMaxHostlistNames;
  return expand_hostlist(expr, &budget);
}

std::string compress_hostlist(const std::vector<std::string>& names) {
  // Group names by the prefix before their numeric suffix, keeping
  // first-appearance order; names without a number stay as they are.
  struct Num {
    unsigned long long value;
    std::string digits;
  };
  std::vector<std::pair<std::string, std::vector<Num>>> groups;
  std::map<std::string, size_t> index;
  std::vector<std::pair<bool, size_t>> order;  // (is group, index into groups or plain)
  std::vector<std::string> plain;
  for (const auto& n : names) {
    size_t d = n.size();
    while (d > 0 && std::isdigit(static_cast<unsigned char>(n[d - 1]))) --d;
    if (d == n.size() || n.size() - d > 18) {
      order.push_back({false, plain.size()});
      plain.push_back(n);
      continue;
    }
    auto [it, inserted] = index.emplace(n.substr(0, d), groups.size());
    if (inserted) {
      groups.push_back({it->first, {}});
      order.push_back({true, it->second});
    }
    groups[it->second].second.push_back({std::stoull(n.substr(d)), n.substr(d)});
  }
  std::string out;
  for (auto [is_group, idx] : order) {
    if (!out.empty()) out += ',';
    if (!is_group) {
      out += plain[idx];
      continue;
    }
    const auto& [prefix, nums] = groups[idx];
    if (nums.size() == 1) {
      out += prefix + nums[0].digits;
      continue;
    }
    out += prefix + '[';
    for (size_t i = 0; i < nums.size();) {
      // A range runs while numbers follow on and print at the first one's width.
      size_t j = i, width = nums[i].digits.size();
      while (j + 1 < nums.size() && nums[j + 1].value == nums[j].value + 1 &&
             pad(nums[j + 1].value, width) == nums[j + 1].digits)
        ++j;
      if (i) out += ',';
      out += nums[i].digits;
      if (j > i) out += '-' + nums[j].digits;
      i = j + 1;
    }
    out += ']';
  }
  return out;
}

}  // namespace ballast::sched
