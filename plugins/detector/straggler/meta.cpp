// meta.yaml, read with libyaml: one mapping of scalars (block or flow, with or
// without `---`). A value the analysis does not read (run_id, ...) is
// skipped only when it is a scalar: a nested mapping or list, an alias, a
// duplicate key or a second document is an error naming the file and line.
#include "trace.hpp"

#include <yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <set>
#include <string>

namespace ballast::straggler {

namespace {

constexpr long kMaxMetaBytes = 1 << 20;

[[noreturn]] void fail(const std::string& path, size_t line, const std::string& key, const std::string& what) {
  std::string msg = path + ":" + std::to_string(line) + ": ";
  if (!key.empty()) msg += "key " + key + ": ";
  throw TraceError(msg + what);
}

std::string read_small_file(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw TraceError(path + ": cannot open: " + std::strerror(errno));
  std::string text;
  char buf[65536];
  while (size_t n = std::fread(buf, 1, sizeof buf, f.get())) {
    text.append(buf, n);
    if (long(text.size()) > kMaxMetaBytes) throw TraceError(path + ": larger than 1 MiB: not a meta.yaml");
  }
  if (std::ferror(f.get())) throw TraceError(path + ": read error: " + std::strerror(errno));
  return text;
}

const char* kind_of(yaml_event_type_t t) {
  switch (t) {
    case YAML_MAPPING_START_EVENT:
      return "a mapping";
    case YAML_SEQUENCE_START_EVENT:
      return "a list";
    case YAML_ALIAS_EVENT:
      return "an alias";
    default:
      return "not a scalar";
  }
}

// The events of one stream, each freed after use; errors carry the line.
class Events {
 public:
  Events(const std::string& path, const std::string& text) : path_(path) {
    yaml_parser_initialize(&parser_);
    yaml_parser_set_input_string(&parser_, reinterpret_cast<const unsigned char*>(text.data()), text.size());
  }
  ~Events() {
    if (has_) yaml_event_delete(&event_);
    yaml_parser_delete(&parser_);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;

  const yaml_event_t& next() {
    if (has_) yaml_event_delete(&event_);
    has_ = false;
    if (!yaml_parser_parse(&parser_, &event_)) {
      std::string what = parser_.problem ? parser_.problem : "not valid YAML";
      if (parser_.context) what += std::string(" (") + parser_.context + ")";
      fail(path_, parser_.problem_mark.line + 1, "", "not valid YAML: " + what);
    }
    has_ = true;
    return event_;
  }
  size_t line() const { return event_.start_mark.line + 1; }
  std::string scalar() const {
    return std::string(reinterpret_cast<const char*>(event_.data.scalar.value), event_.data.scalar.length);
  }

 private:
  std::string path_;
  yaml_parser_t parser_{};
  yaml_event_t event_{};
  bool has_ = false;
};

int size_of(const std::string& path, size_t line, const std::string& key, const std::string& value) {
  int v = 0;
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || p != value.data() + value.size() || v <= 0 || v > (1 << 20))
    fail(path, line, key, "'" + value.substr(0, 40) + "' is not a positive integer up to 1048576");
  return v;
}

}  // namespace

Meta read_meta(const std::string& path) {
  const std::string text = read_small_file(path);
  Events ev(path, text);
  Meta m;
  size_t last_line = 1;
  ev.next();                                              // stream start
  if (ev.next().type == YAML_STREAM_END_EVENT) return m;  // an empty file
  // A document: one mapping, or nothing (a file of comments).
  const yaml_event_t& root = ev.next();
  if (root.type == YAML_SCALAR_EVENT && root.data.scalar.length == 0) {
    ev.next();  // document end
  } else {
    if (root.type != YAML_MAPPING_START_EVENT)
      fail(path, ev.line(), "",
           std::string("expected a mapping of 'key: value', got ") +
               (root.type == YAML_SCALAR_EVENT ? "a scalar" : kind_of(root.type)));
    std::set<std::string> seen;
    int* sizes[] = {&m.dp, &m.pp, &m.tp, &m.dsp, &m.vpp, &m.world};
    const char* size_keys[] = {"dp_size", "pp_size", "tp_size", "dsp_size", "vpp_size", "world_size"};
    for (;;) {
      const yaml_event_t& k = ev.next();
      if (k.type == YAML_MAPPING_END_EVENT) break;
      if (k.type != YAML_SCALAR_EVENT) fail(path, ev.line(), "", std::string("a key is ") + kind_of(k.type));
      const std::string key = ev.scalar();
      const size_t key_line = ev.line();
      if (!seen.insert(key).second) fail(path, key_line, key, "given twice");
      const yaml_event_t& v = ev.next();
      last_line = ev.line();
      if (v.type != YAML_SCALAR_EVENT)
        fail(path, ev.line(), key,
             std::string("expected a scalar value, got ") + kind_of(v.type) + " (meta.yaml is one flat mapping)");
      const std::string value = ev.scalar();
      if (key == "trial_name") {
        m.trial_name = value;
        continue;
      }
      for (size_t i = 0; i < std::size(size_keys); ++i)
        if (key == size_keys[i]) *sizes[i] = size_of(path, last_line, key, value);
    }
    ev.next();  // document end
  }
  if (ev.next().type != YAML_STREAM_END_EVENT) fail(path, ev.line(), "", "a second YAML document: meta.yaml holds one");

  if (uint64_t(std::max(m.dp, 1)) * uint64_t(std::max(m.pp, 1)) > kMaxGridCells)
    fail(path, last_line, "dp_size",
         "dp_size " + std::to_string(m.dp) + " times pp_size " + std::to_string(m.pp) + " is more than " +
             std::to_string(kMaxGridCells));
  // In 64 bits: four sizes of up to 2^31 each would wrap an int.
  const uint64_t product = uint64_t(m.dp) * uint64_t(m.pp) * uint64_t(m.tp) * uint64_t(m.dsp);
  if (m.world && m.dp && m.pp && uint64_t(m.world) != product)
    fail(path, last_line, "world_size",
         std::to_string(m.world) + " is not dp_size*pp_size*tp_size*dsp_size = " + std::to_string(product));
  return m;
}

}  // namespace ballast::straggler
