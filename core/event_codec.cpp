#include "event_codec.hpp"

#include "codec_flat.hpp"
#include "codec_schema.hpp"
#include "json_depth.hpp"
#include "topic.hpp"
#include "utf8.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <memory_resource>
#include <stdexcept>
#include <string_view>
#include <type_traits>

namespace ballast {

using codec::field_ref;
using codec::FieldDesc;
using codec::FieldType;
using codec::StructDesc;

// ---- OwnedEvent ---------------------------------------------------------------

// The event and one flattened buffer holding everything it points to
// (codec_flat.hpp): one allocation for the whole deep copy.
struct OwnedEvent::Storage {
  ballast_event event{};
  std::unique_ptr<uint64_t[]> buffer;  // uint64_t: the flat layout needs 8-byte alignment
};

namespace {

const ballast_event kEmptyEvent = {
    sizeof(ballast_event), BALLAST_SCHEMA_NONE, "", 0, {nullptr, -1, nullptr}, nullptr, 0};

}  // namespace

// The one place that builds OwnedEvent's storage (a friend of OwnedEvent).
class EventBuilder {
 public:
  static std::unique_ptr<OwnedEvent::Storage> copy(const ballast_event& event);
};

OwnedEvent::OwnedEvent() = default;
OwnedEvent::OwnedEvent(const ballast_event& event) : s_(EventBuilder::copy(event)) {}
OwnedEvent::OwnedEvent(const OwnedEvent& other) : s_(other.s_ ? EventBuilder::copy(other.s_->event) : nullptr) {}
OwnedEvent& OwnedEvent::operator=(const OwnedEvent& other) {
  if (this != &other) s_ = other.s_ ? EventBuilder::copy(other.s_->event) : nullptr;
  return *this;
}
OwnedEvent::OwnedEvent(OwnedEvent&&) noexcept = default;
OwnedEvent& OwnedEvent::operator=(OwnedEvent&&) noexcept = default;
OwnedEvent::~OwnedEvent() = default;

const ballast_event& OwnedEvent::view() const { return s_ ? s_->event : kEmptyEvent; }

std::unique_ptr<OwnedEvent::Storage> EventBuilder::copy(const ballast_event& event) {
  ballast_event src = event;
  const char* why = nullptr;
  if (!codec::check_event(event, &why)) {
    // Documented in the header: a malformed event keeps its topic and source
    // but not its payload, which cannot be read safely.
    src.size = sizeof(ballast_event);
    if (src.topic == nullptr) src.topic = "";
    src.schema = BALLAST_SCHEMA_NONE;
    src.payload = nullptr;
    src.payload_size = 0;
  }
  auto s = std::make_unique<OwnedEvent::Storage>();
  const size_t bytes = codec::flat_size(src);
  s->buffer.reset(new uint64_t[(bytes + 7) / 8 + 1]);
  codec::flatten(src, reinterpret_cast<unsigned char*>(s->buffer.get()), &s->event);
  return s;
}

namespace {

// Owns the strings and blocks of an event under construction (from JSON or
// from a frame); the event is then deep-copied into an OwnedEvent.
struct Builder {
  std::deque<std::string> strings;
  std::deque<std::vector<uint64_t>> blocks;

  const char* keep(std::string s) { return strings.emplace_back(std::move(s)).c_str(); }
  void* block(size_t bytes) { return blocks.emplace_back((bytes + 7) / 8 + 1, uint64_t{0}).data(); }
};

}  // namespace

// ---- schema names and topics ----------------------------------------------------

uint32_t schema_for_topic(const char* topic) {
  if (topic == nullptr) return BALLAST_SCHEMA_JSON;
  const std::string_view t(topic);
  uint32_t n = 0;
  const StructDesc* const* structs = codec::well_known_structs(&n);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t k = 0; k < structs[i]->topic_count; ++k)
      if (t == structs[i]->topics[k]) return structs[i]->schema;
  return BALLAST_SCHEMA_JSON;
}

const char* schema_name(uint32_t schema) {
  if (schema == BALLAST_SCHEMA_NONE) return "none";
  if (schema == BALLAST_SCHEMA_JSON) return "json";
  const StructDesc* desc = codec::struct_for_schema(schema);
  return desc != nullptr ? desc->name : "custom";
}

namespace {

bool schema_from_name(std::string_view name, uint32_t* schema) {
  if (name == "none" || name == "json") {
    *schema = name == "none" ? uint32_t{BALLAST_SCHEMA_NONE} : uint32_t{BALLAST_SCHEMA_JSON};
    return true;
  }
  uint32_t n = 0;
  const StructDesc* const* structs = codec::well_known_structs(&n);
  for (uint32_t i = 0; i < n; ++i) {
    if (name == structs[i]->name) {
      *schema = structs[i]->schema;
      return true;
    }
  }
  return false;
}

// ---- JSON out -------------------------------------------------------------------

// Text for JSON: nlohmann::json refuses to dump invalid UTF-8, and events
// come from anywhere (a journal, a plugin), so invalid bytes become U+FFFD.
std::string utf8(const char* p, size_t n) {
  std::string out;
  out.reserve(n);
  const char* why = nullptr;
  for (size_t i = 0; i < n;) {
    size_t len = static_cast<unsigned char>(p[i]) < 0x80 ? 1 : util::utf8_sequence(p + i, p + n, &why);
    if (len > 0) {
      out.append(p + i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

nlohmann::json text(const char* s) {
  return s != nullptr ? nlohmann::json(utf8(s, std::strlen(s))) : nlohmann::json(nullptr);
}

nlohmann::json number_to_json(double v) {
  // JSON has no NaN or infinity; INVALID metric samples carry them.
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

nlohmann::json json_text_to_json(const char* text, size_t size) {
  // Too deep to print safely: kept as text, like text that is not JSON.
  if (!json_depth_within(std::string_view(text, size))) return utf8(text, size);
  nlohmann::json parsed = nlohmann::json::parse(text, text + size, nullptr, false);
  if (parsed.is_discarded()) return utf8(text, size);  // not JSON: kept as text
  return parsed;
}

nlohmann::json struct_to_json(const StructDesc& desc, const void* base) {
  nlohmann::json out = nlohmann::json::object();
  for (uint32_t i = 0; i < desc.field_count; ++i) {
    const FieldDesc& f = desc.fields[i];
    switch (f.type) {
      case FieldType::size:
      case FieldType::count:
        break;
      case FieldType::u32: {
        const uint32_t v = field_ref<uint32_t>(base, f);
        if (v < f.name_count)
          out[f.name] = f.names[v];
        else
          out[f.name] = v;
        break;
      }
      case FieldType::i32:
        out[f.name] = field_ref<int32_t>(base, f);
        break;
      case FieldType::u64:
        out[f.name] = field_ref<uint64_t>(base, f);
        break;
      case FieldType::i64:
        out[f.name] = field_ref<int64_t>(base, f);
        break;
      case FieldType::f64:
        out[f.name] = number_to_json(field_ref<double>(base, f));
        break;
      case FieldType::str: {
        const char* s = field_ref<const char*>(base, f);
        out[f.name] = text(s);
        break;
      }
      case FieldType::json_str: {
        const char* s = field_ref<const char*>(base, f);
        out[f.name] = s != nullptr ? json_text_to_json(s, std::strlen(s)) : nlohmann::json(nullptr);
        break;
      }
      case FieldType::array: {
        const uint32_t n = *reinterpret_cast<const uint32_t*>(static_cast<const unsigned char*>(base) + f.count_offset);
        const auto* elems = static_cast<const unsigned char*>(field_ref<const void*>(base, f));
        nlohmann::json arr = nlohmann::json::array();
        for (uint32_t k = 0; k < n; ++k) arr.push_back(struct_to_json(*f.elem, elems + size_t{k} * f.elem->size));
        out[f.name] = std::move(arr);
        break;
      }
    }
  }
  return out;
}

std::string to_hex(const unsigned char* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[p[i] >> 4];
    s[2 * i + 1] = kDigits[p[i] & 15];
  }
  return s;
}

}  // namespace

nlohmann::json event_to_json(const ballast_event& event) {
  nlohmann::json j = nlohmann::json::object();
  j["topic"] = text(event.topic != nullptr ? event.topic : "");
  j["ts"] = static_cast<double>(event.ts_ns) / 1e9;
  j["ts_ns"] = event.ts_ns;
  j["source"] = {{"node", text(event.source.node)}, {"rank", event.source.rank}, {"plugin", text(event.source.plugin)}};
  const char* name = schema_name(event.schema);
  j["schema"] = name;
  if (std::strcmp(name, "custom") == 0) j["schema_id"] = event.schema;
  const char* why = nullptr;
  if (!codec::check_event(event, &why)) {
    j["payload_error"] = why;
    return j;
  }
  if (const StructDesc* desc = codec::struct_for_schema(event.schema)) {
    codec::PayloadScratch scratch;
    j["payload"] = struct_to_json(*desc, codec::whole_payload(event, &scratch));
  } else if (event.schema == BALLAST_SCHEMA_JSON) {
    if (event.payload_size > 0)
      j["payload"] = json_text_to_json(static_cast<const char*>(event.payload), event.payload_size);
  } else if (event.payload_size > 0) {
    j["payload"] = {{"bytes_hex", to_hex(static_cast<const unsigned char*>(event.payload), event.payload_size)}};
  }
  return j;
}

// ---- JSON in --------------------------------------------------------------------

namespace {

struct JsonReader {
  Builder& b;
  std::string* error;

  bool bad(const std::string& path, const std::string& what) {
    if (error != nullptr) *error = path + ": " + what;
    return false;
  }

  template <typename T>
  bool integer(const nlohmann::json& v, const std::string& path, T* out) {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) return bad(path, "out of range");
      *out = static_cast<T>(u);
      return true;
    }
    if (v.is_number_integer()) {
      const int64_t s = v.get<int64_t>();
      if (s < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          (s > 0 && static_cast<uint64_t>(s) > static_cast<uint64_t>(std::numeric_limits<T>::max())))
        return bad(path, "out of range");
      *out = static_cast<T>(s);
      return true;
    }
    if (v.is_number_float()) {
      // Lua and JavaScript write integers as floats: accept integral ones.
      const double d = v.get<double>();
      if (!(d == std::floor(d)) || d < static_cast<double>(std::numeric_limits<T>::min()) ||
          d >= std::ldexp(1.0, std::numeric_limits<T>::digits))
        return bad(path, "expected an integer");
      *out = static_cast<T>(d);
      return true;
    }
    return bad(path, "expected an integer");
  }

  bool number(const nlohmann::json& v, const std::string& path, double* out) {
    if (v.is_number()) {
      *out = v.get<double>();
      return true;
    }
    if (v.is_string()) {
      const std::string& s = v.get_ref<const std::string&>();
      if (s == "nan")
        *out = std::numeric_limits<double>::quiet_NaN();
      else if (s == "inf")
        *out = std::numeric_limits<double>::infinity();
      else if (s == "-inf")
        *out = -std::numeric_limits<double>::infinity();
      else
        return bad(path, "expected a number");
      return true;
    }
    return bad(path, "expected a number");
  }

  bool string(const nlohmann::json& v, const std::string& path, const char** out) {
    if (v.is_null()) {
      *out = nullptr;
      return true;
    }
    if (!v.is_string()) return bad(path, "expected a string or null");
    *out = b.keep(v.get<std::string>());
    return true;
  }

  bool field(const FieldDesc& f, const nlohmann::json* v, const std::string& path, void* base) {
    switch (f.type) {
      case FieldType::size:
      case FieldType::count:
        return true;  // derived
      case FieldType::u32:
        if (v == nullptr) {
          field_ref<uint32_t>(base, f) = static_cast<uint32_t>(f.missing);
          return true;
        }
        if (v->is_string() && f.name_count > 0) {
          for (uint32_t k = 0; k < f.name_count; ++k) {
            if (*v == f.names[k]) {
              field_ref<uint32_t>(base, f) = k;
              return true;
            }
          }
          return bad(path, "unknown value \"" + v->get<std::string>() + "\"");
        }
        return integer(*v, path, &field_ref<uint32_t>(base, f));
      case FieldType::i32:
        if (v == nullptr) return (field_ref<int32_t>(base, f) = static_cast<int32_t>(f.missing), true);
        return integer(*v, path, &field_ref<int32_t>(base, f));
      case FieldType::u64:
        if (v == nullptr) return (field_ref<uint64_t>(base, f) = static_cast<uint64_t>(f.missing), true);
        return integer(*v, path, &field_ref<uint64_t>(base, f));
      case FieldType::i64:
        if (v == nullptr) return (field_ref<int64_t>(base, f) = f.missing, true);
        return integer(*v, path, &field_ref<int64_t>(base, f));
      case FieldType::f64:
        if (v == nullptr) return (field_ref<double>(base, f) = static_cast<double>(f.missing), true);
        return number(*v, path, &field_ref<double>(base, f));
      case FieldType::str:
        if (v == nullptr) return (field_ref<const char*>(base, f) = nullptr, true);
        return string(*v, path, &field_ref<const char*>(base, f));
      case FieldType::json_str:
        if (v == nullptr || v->is_null()) return (field_ref<const char*>(base, f) = nullptr, true);
        if (v->is_string()) return string(*v, path, &field_ref<const char*>(base, f));
        field_ref<const char*>(base, f) = b.keep(v->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        return true;
      case FieldType::array: {
        uint32_t n = 0;
        void* elems = nullptr;
        if (v != nullptr && !v->is_null()) {
          if (!v->is_array()) return bad(path, "expected an array");
          if (v->size() > std::numeric_limits<uint32_t>::max()) return bad(path, "too many entries");
          n = static_cast<uint32_t>(v->size());
          elems = n > 0 ? b.block(size_t{n} * f.elem->size) : nullptr;
          for (uint32_t k = 0; k < n; ++k) {
            if (!object(*f.elem, (*v)[k], path + "[" + std::to_string(k) + "]",
                        static_cast<unsigned char*>(elems) + size_t{k} * f.elem->size))
              return false;
          }
        }
        field_ref<void*>(base, f) = elems;
        *reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(base) + f.count_offset) = n;
        return true;
      }
    }
    return bad(path, "unhandled field type");
  }

  bool object(const StructDesc& desc, const nlohmann::json& j, const std::string& path, void* base) {
    if (!j.is_object()) return bad(path, "expected an object");
    for (auto it = j.begin(); it != j.end(); ++it) {
      bool known = false;
      for (uint32_t i = 0; i < desc.field_count && !known; ++i) known = it.key() == desc.fields[i].name;
      if (!known) return bad(path + "." + it.key(), std::string("unknown field of ") + desc.name);
    }
    for (uint32_t i = 0; i < desc.field_count; ++i) {
      const FieldDesc& f = desc.fields[i];
      auto it = j.find(f.name);
      if (!field(f, it != j.end() ? &*it : nullptr, path + "." + f.name, base)) return false;
    }
    return true;
  }

  bool hex(const std::string& s, const std::string& path, std::string* out) {
    if (s.size() % 2 != 0) return bad(path, "odd number of hex digits");
    out->resize(s.size() / 2);
    for (size_t i = 0; i < out->size(); ++i) {
      int v = 0;
      for (int k = 0; k < 2; ++k) {
        const char c = s[2 * i + k];
        int d = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                         : -1;
        if (d < 0) return bad(path, "not a hex digit at " + std::to_string(2 * i + k));
        v = v * 16 + d;
      }
      (*out)[i] = static_cast<char>(v);
    }
    return true;
  }
};

int from_json_impl(const nlohmann::json& j, OwnedEvent* out, std::string* error) {
  Builder b;
  JsonReader r{b, error};
  auto fail_format = [] { return BALLAST_EFORMAT; };
  if (!j.is_object()) return r.bad("event", "expected an object"), fail_format();

  ballast_event ev{};
  ev.size = sizeof(ballast_event);
  auto topic = j.find("topic");
  if (topic == j.end()) return r.bad("topic", "missing"), fail_format();
  if (!topic->is_string()) return r.bad("topic", "expected a string"), fail_format();
  if (!valid_topic(topic->get_ref<const std::string&>()))
    return r.bad("topic", invalid_topic_message(topic->get<std::string>())), fail_format();
  ev.topic = b.keep(topic->get<std::string>());

  if (auto ts_ns = j.find("ts_ns"); ts_ns != j.end()) {
    if (!r.integer(*ts_ns, "ts_ns", &ev.ts_ns)) return fail_format();
  } else if (auto ts = j.find("ts"); ts != j.end()) {
    double s = 0;
    if (!ts->is_number()) return r.bad("ts", "expected a number"), fail_format();
    s = ts->get<double>();
    if (!(std::fabs(s) < 9.2e9)) return r.bad("ts", "out of range"), fail_format();
    ev.ts_ns = std::llround(s * 1e9);
  }

  ev.source.rank = -1;
  if (auto src = j.find("source"); src != j.end() && !src->is_null()) {
    if (!src->is_object()) return r.bad("source", "expected an object"), fail_format();
    if (auto v = src->find("node"); v != src->end() && !r.string(*v, "source.node", &ev.source.node))
      return fail_format();
    if (auto v = src->find("plugin"); v != src->end() && !r.string(*v, "source.plugin", &ev.source.plugin))
      return fail_format();
    if (auto v = src->find("rank"); v != src->end() && !v->is_null() && !r.integer(*v, "source.rank", &ev.source.rank))
      return fail_format();
  }

  ev.schema = schema_for_topic(ev.topic);
  if (auto s = j.find("schema"); s != j.end() && !s->is_null()) {
    if (s->is_string()) {
      const std::string& name = s->get_ref<const std::string&>();
      if (name == "custom") {
        auto id = j.find("schema_id");
        if (id == j.end()) return r.bad("schema_id", "missing for a custom schema"), fail_format();
        if (!r.integer(*id, "schema_id", &ev.schema)) return fail_format();
      } else if (!schema_from_name(name, &ev.schema)) {
        return r.bad("schema", "unknown schema \"" + name + "\""), fail_format();
      }
    } else if (!r.integer(*s, "schema", &ev.schema)) {
      return fail_format();
    }
  }

  auto payload = j.find("payload");
  const nlohmann::json* p = (payload != j.end() && !payload->is_null()) ? &*payload : nullptr;
  if (const StructDesc* desc = codec::struct_for_schema(ev.schema)) {
    void* base = b.block(desc->size);
    *static_cast<uint32_t*>(base) = desc->size;
    if (!r.object(*desc, p != nullptr ? *p : nlohmann::json::object(), "payload", base)) return fail_format();
    ev.payload = base;
    ev.payload_size = desc->size;
  } else if (ev.schema == BALLAST_SCHEMA_NONE && p != nullptr && !(p->is_object() && p->contains("bytes_hex"))) {
    // Bytes published with schema none are written as bytes_hex (event_to_json):
    // read back as such, so that journal -> JSON lines -> events round-trips.
    return r.bad("payload", "schema \"none\" carries raw bytes only ({\"bytes_hex\": ...})"), fail_format();
  } else if (ev.schema == BALLAST_SCHEMA_JSON) {
    if (p != nullptr) {
      const char* text = b.keep(p->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      ev.payload = text;
      ev.payload_size = std::strlen(text);
    }
  } else if (p != nullptr) {
    auto bytes = p->is_object() ? p->find("bytes_hex") : p->end();
    if (!p->is_object() || bytes == p->end() || !bytes->is_string())
      return r.bad("payload.bytes_hex", "expected a hex string for schema none or a custom schema"), fail_format();
    std::string raw;
    if (!r.hex(bytes->get<std::string>(), "payload.bytes_hex", &raw)) return fail_format();
    const char* kept = b.keep(std::move(raw));
    ev.payload = kept;
    ev.payload_size = b.strings.back().size();
  }
  *out = OwnedEvent(ev);
  return BALLAST_OK;
}

}  // namespace

int event_from_json(const nlohmann::json& json, OwnedEvent* out, std::string* error) {
  try {
    return from_json_impl(json, out, error);
  } catch (const std::exception& e) {
    if (error != nullptr) *error = std::string("event: ") + e.what();
    return BALLAST_EFORMAT;
  }
}

// ---- frames ---------------------------------------------------------------------

namespace {

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u16(unsigned char* p, uint16_t v) {
  p[0] = static_cast<unsigned char>(v);
  p[1] = static_cast<unsigned char>(v >> 8);
}
uint32_t get_u32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint16_t get_u16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

constexpr unsigned char kMagic[4] = {'B', 'L', 'F', '1'};

// The body is cereal's portable binary archive of the event: a byte-order
// byte (1 = little endian), then every value fixed-width in that order, and
// raw bytes for binary_data. It is written and read here by hand, not
// through cereal's archives, which go through a std::ostream / std::istream
// with a virtual call per field: with them, decode_frame took 2.9 us and
// encode_frame 1.9 us per metric batch of 20 samples (1,183 bytes; a memcpy
// of the frame: 10 ns), half a core at 100k events/s, the controller's
// largest cost (`bench_cluster --only codec`, docs/benchmarks.md
// "cluster"). The format is unchanged: test_event_codec reads these bodies
// with cereal's own archive, and decodes what cereal writes.
//
// Body layout: byte order u8, schema u32, topic, ts_ns i64, node, rank i32,
// plugin, then the payload: a well-known struct field by field in table
// order (arrays as a u32 count and their elements), other schemas as u64
// length and bytes. Strings: u8 present, then u64 length and bytes when
// present.
constexpr uint8_t kLittleEndian = 1;

struct FrameError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Writes little-endian values at a cursor into space sized beforehand
// (body_size).
struct BodyWriter {
  unsigned char* p;

  template <typename T>
  void put(T v) {
    static_assert(std::is_arithmetic_v<T>);
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    if constexpr (std::endian::native == std::endian::big) std::reverse(b, b + sizeof(T));
    std::memcpy(p, b, sizeof(T));
    p += sizeof(T);
  }
  void bytes(const void* data, size_t n) {
    if (n > 0) std::memcpy(p, data, n);
    p += n;
  }
  void str(const char* s) {
    put(uint8_t{s != nullptr});
    if (s == nullptr) return;
    const uint64_t n = std::strlen(s);
    put(n);
    bytes(s, n);
  }
};

// Bytes a string takes in a body.
size_t str_size(const char* s) { return s != nullptr ? 1 + 8 + std::strlen(s) : 1; }

// Bytes a struct takes in a body.
size_t struct_size(const StructDesc& desc, const void* base) {
  size_t n = 0;
  for (uint32_t i = 0; i < desc.field_count; ++i) {
    const FieldDesc& f = desc.fields[i];
    switch (f.type) {
      case FieldType::size:
      case FieldType::count:
        break;
      case FieldType::u32:
      case FieldType::i32:
        n += 4;
        break;
      case FieldType::u64:
      case FieldType::i64:
      case FieldType::f64:
        n += 8;
        break;
      case FieldType::str:
      case FieldType::json_str:
        n += str_size(field_ref<const char*>(base, f));
        break;
      case FieldType::array: {
        const uint32_t count =
            *reinterpret_cast<const uint32_t*>(static_cast<const unsigned char*>(base) + f.count_offset);
        n += 4;
        const auto* elems = static_cast<const unsigned char*>(field_ref<const void*>(base, f));
        for (uint32_t k = 0; k < count; ++k) n += struct_size(*f.elem, elems + size_t{k} * f.elem->size);
        break;
      }
    }
  }
  return n;
}

void put_struct(BodyWriter& w, const StructDesc& desc, const void* base) {
  for (uint32_t i = 0; i < desc.field_count; ++i) {
    const FieldDesc& f = desc.fields[i];
    switch (f.type) {
      case FieldType::size:
      case FieldType::count:
        break;
      case FieldType::u32:
        w.put(field_ref<uint32_t>(base, f));
        break;
      case FieldType::i32:
        w.put(field_ref<int32_t>(base, f));
        break;
      case FieldType::u64:
        w.put(field_ref<uint64_t>(base, f));
        break;
      case FieldType::i64:
        w.put(field_ref<int64_t>(base, f));
        break;
      case FieldType::f64:
        w.put(field_ref<double>(base, f));
        break;
      case FieldType::str:
      case FieldType::json_str:
        w.str(field_ref<const char*>(base, f));
        break;
      case FieldType::array: {
        const uint32_t n = *reinterpret_cast<const uint32_t*>(static_cast<const unsigned char*>(base) + f.count_offset);
        w.put(n);
        const auto* elems = static_cast<const unsigned char*>(field_ref<const void*>(base, f));
        for (uint32_t k = 0; k < n; ++k) put_struct(w, *f.elem, elems + size_t{k} * f.elem->size);
        break;
      }
    }
  }
}

// The fewest bytes one struct takes in a frame body (a string takes its
// marker byte, an array its count): what bounds an element count by the body.
size_t min_encoded_size(const StructDesc& desc) {
  size_t n = 0;
  for (uint32_t i = 0; i < desc.field_count; ++i) {
    switch (desc.fields[i].type) {
      case FieldType::size:
      case FieldType::count:
        break;
      case FieldType::u32:
      case FieldType::i32:
      case FieldType::array:
        n += 4;
        break;
      case FieldType::u64:
      case FieldType::i64:
      case FieldType::f64:
        n += 8;
        break;
      case FieldType::str:
      case FieldType::json_str:
        n += 1;
        break;
    }
  }
  return n > 0 ? n : 1;
}

// Where a decoded event's strings and arrays go (decode_frame_into's
// memory). What it takes is bounded by the body (the checks below).
struct Arena {
  std::pmr::memory_resource* mem;

  const char* keep(const unsigned char* s, size_t n) {
    auto* p = static_cast<char*>(mem->allocate(n + 1, 1));
    if (n > 0) std::memcpy(p, s, n);
    p[n] = '\0';
    return p;
  }
  void* block(size_t bytes) {
    void* p = mem->allocate(bytes, 8);
    std::memset(p, 0, bytes);
    return p;
  }
};

// Reads a body in place; every read is checked against the bytes left.
struct BodyReader {
  const unsigned char* p;
  const unsigned char* end;
  Arena& arena;
  bool swap = false;  // a big-endian body

  size_t remaining() const { return static_cast<size_t>(end - p); }
  template <typename T>
  void get(T& v, const char* what) {
    static_assert(std::is_arithmetic_v<T>);
    if (sizeof(T) > remaining())
      throw FrameError(std::string(what) + ": " + std::to_string(sizeof(T)) + " bytes needed, " +
                       std::to_string(remaining()) + " left in the body");
    unsigned char b[sizeof(T)];
    std::memcpy(b, p, sizeof(T));
    if (swap != (std::endian::native == std::endian::big)) std::reverse(b, b + sizeof(T));
    std::memcpy(&v, b, sizeof(T));
    p += sizeof(T);
  }
  void byte_order() {
    uint8_t little = 0;
    get(little, "byte order");
    if (little > 1) throw FrameError("bad byte-order marker " + std::to_string(little));
    swap = little != kLittleEndian;
  }
  uint64_t length(const char* what) {
    uint64_t n = 0;
    get(n, what);
    if (n > remaining())
      throw FrameError(std::string(what) + " length " + std::to_string(n) + " is past the end of the body");
    return n;
  }
  const char* str(const char* what) {
    uint8_t present = 0;
    get(present, what);
    if (present > 1) throw FrameError(std::string(what) + ": bad string marker");
    if (present == 0) return nullptr;
    const size_t n = length(what);
    if (std::memchr(p, '\0', n) != nullptr) throw FrameError(std::string(what) + ": NUL inside a string");
    const char* s = arena.keep(p, n);
    p += n;
    return s;
  }
  void get_struct(const StructDesc& desc, void* base) {
    *static_cast<uint32_t*>(base) = desc.size;  // harmless for elements: overwritten by their first field
    for (uint32_t i = 0; i < desc.field_count; ++i) {
      const FieldDesc& f = desc.fields[i];
      switch (f.type) {
        case FieldType::size:
          field_ref<uint32_t>(base, f) = desc.size;
          break;
        case FieldType::count:
          break;
        case FieldType::u32:
          get(field_ref<uint32_t>(base, f), f.name);
          break;
        case FieldType::i32:
          get(field_ref<int32_t>(base, f), f.name);
          break;
        case FieldType::u64:
          get(field_ref<uint64_t>(base, f), f.name);
          break;
        case FieldType::i64:
          get(field_ref<int64_t>(base, f), f.name);
          break;
        case FieldType::f64:
          get(field_ref<double>(base, f), f.name);
          break;
        case FieldType::str:
        case FieldType::json_str:
          field_ref<const char*>(base, f) = str(f.name);
          break;
        case FieldType::array: {
          uint32_t n = 0;
          get(n, f.name);
          // Every element takes at least min_encoded_size bytes: the
          // allocation stays within a small multiple of the body.
          if (uint64_t{n} * min_encoded_size(*f.elem) > remaining())
            throw FrameError(std::string(f.name) + ": " + std::to_string(n) + " entries cannot fit in the body");
          void* elems = n > 0 ? arena.block(size_t{n} * f.elem->size) : nullptr;
          for (uint32_t k = 0; k < n; ++k)
            get_struct(*f.elem, static_cast<unsigned char*>(elems) + size_t{k} * f.elem->size);
          field_ref<void*>(base, f) = elems;
          *reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(base) + f.count_offset) = n;
          break;
        }
      }
    }
  }
};

}  // namespace

void encode_frame(const ballast_event& event, std::vector<unsigned char>* out) {
  const char* why = nullptr;
  const bool ok = codec::check_event(event, &why);
  const char* topic = event.topic != nullptr ? event.topic : "";
  const StructDesc* desc = ok ? codec::struct_for_schema(event.schema) : nullptr;
  codec::PayloadScratch scratch;
  const void* payload = desc != nullptr ? codec::whole_payload(event, &scratch) : nullptr;
  // A malformed payload is not read (see OwnedEvent): framed as empty.
  const uint64_t opaque = ok && desc == nullptr ? event.payload_size : 0;
  const size_t body = 1 + 4 + str_size(topic) + 8 + str_size(event.source.node) + 4 + str_size(event.source.plugin) +
                      (desc != nullptr ? struct_size(*desc, payload) : 8 + opaque);
  const size_t start = out->size();
  out->resize(start + kFrameHeaderSize + body);
  unsigned char* h = out->data() + start;
  BodyWriter w{h + kFrameHeaderSize};
  w.put(kLittleEndian);
  w.put(ok ? event.schema : uint32_t{BALLAST_SCHEMA_NONE});
  w.str(topic);
  w.put(event.ts_ns);
  w.str(event.source.node);
  w.put(event.source.rank);
  w.str(event.source.plugin);
  if (desc != nullptr) {
    put_struct(w, *desc, payload);
  } else {
    w.put(opaque);
    w.bytes(event.payload, opaque);
  }
  std::memcpy(h, kMagic, 4);
  put_u16(h + 4, kFrameVersion);
  put_u16(h + 6, 0);
  put_u32(h + 8, static_cast<uint32_t>(body));
  put_u32(h + 12, crc32c(h + kFrameHeaderSize, body));
}

int decode_frame(const unsigned char* data, size_t size, OwnedEvent* out, size_t* consumed, std::string* error) {
  // A frame of the usual size decodes without a heap allocation before the
  // one copy into its OwnedEvent.
  alignas(8) unsigned char inline_buf[8192];
  std::pmr::monotonic_buffer_resource mem(inline_buf, sizeof inline_buf);
  ballast_event ev{};
  const int rc = decode_frame_into(data, size, &mem, &ev, consumed, error);
  if (rc == BALLAST_OK) *out = OwnedEvent(ev);
  return rc;
}

int decode_frame_into(const unsigned char* data, size_t size, std::pmr::memory_resource* memory, ballast_event* out,
                      size_t* consumed, std::string* error) {
  auto bad = [error](std::string why) {
    if (error != nullptr) *error = std::move(why);
    return BALLAST_EFORMAT;
  };
  if (size < kFrameHeaderSize) return bad("truncated frame header: " + std::to_string(size) + " bytes left, 16 needed");
  if (std::memcmp(data, kMagic, 4) != 0) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08x", get_u32(data));
    return bad(std::string("bad magic ") + hex + " (expected \"BLF1\")");
  }
  const uint16_t version = get_u16(data + 4);
  if (version != kFrameVersion) return bad("unknown frame version " + std::to_string(version));
  const uint16_t flags = get_u16(data + 6);
  if (flags != 0) return bad("unknown frame flags " + std::to_string(flags));
  const uint32_t length = get_u32(data + 8);
  if (length > kMaxFrameBody)
    return bad("frame body of " + std::to_string(length) + " bytes is above the limit of " +
               std::to_string(kMaxFrameBody));
  if (length > size - kFrameHeaderSize)
    return bad("truncated frame: header says " + std::to_string(length) + " bytes, " +
               std::to_string(size - kFrameHeaderSize) + " left");
  const unsigned char* body = data + kFrameHeaderSize;
  const uint32_t want = get_u32(data + 12);
  const uint32_t got = crc32c(body, length);
  if (want != got) {
    char msg[96];
    std::snprintf(msg, sizeof msg, "checksum mismatch: header says 0x%08x, body has 0x%08x", want, got);
    return bad(msg);
  }
  try {
    Arena arena{memory};
    BodyReader r{body, body + length, arena};
    r.byte_order();
    ballast_event ev{};
    ev.size = sizeof(ballast_event);
    r.get(ev.schema, "schema");
    ev.topic = r.str("topic");
    if (ev.topic == nullptr || !valid_topic(ev.topic)) throw FrameError("the topic is not a valid topic");
    r.get(ev.ts_ns, "ts_ns");
    ev.source.node = r.str("source.node");
    r.get(ev.source.rank, "source.rank");
    ev.source.plugin = r.str("source.plugin");
    if (const StructDesc* desc = codec::struct_for_schema(ev.schema)) {
      void* base = arena.block(desc->size);
      r.get_struct(*desc, base);
      ev.payload = base;
      ev.payload_size = desc->size;
    } else {
      const uint64_t n = r.length("payload");
      if (n > 0) {
        // Followed by a NUL, not counted (codec_flat.hpp: JSON text reads as a C string).
        ev.payload = arena.keep(r.p, n);
        ev.payload_size = n;
        r.p += n;
      }
    }
    if (r.remaining() != 0) throw FrameError(std::to_string(r.remaining()) + " unread bytes at the end of the body");
    *out = ev;
  } catch (const std::exception& e) {
    return bad(std::string("malformed frame body: ") + e.what());
  } catch (...) {
    return bad("malformed frame body");
  }
  *consumed = kFrameHeaderSize + length;
  return BALLAST_OK;
}

}  // namespace ballast
