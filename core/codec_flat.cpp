#include "codec_flat.hpp"

#include "codec_schema.hpp"

#include <array>
#include <cstdint>
#include <cstring>

namespace ballast::codec {

namespace {

// A bump allocator over the copy's buffer. Sizing (no buffer) and copying
// run the same walk, so that the two can never disagree. With a capacity,
// a copy that would not fit stops writing and only goes on counting, so
// that a queue slot is filled in one pass when the event fits its inline
// buffer (the common case) and sized for the heap when it does not.
struct Arena {
  unsigned char* base = nullptr;  // nullptr: only count
  size_t cap = SIZE_MAX;
  size_t used = 0;

  unsigned char* take(size_t bytes, size_t align) {
    used = (used + align - 1) & ~(align - 1);
    unsigned char* p = (base != nullptr && bytes <= cap && used <= cap - bytes) ? base + used : nullptr;
    used += bytes;
    return p;
  }
  bool fits() const { return base != nullptr && used <= cap; }
  const char* str(const char* s) {
    if (s == nullptr) return nullptr;
    const size_t n = std::strlen(s) + 1;
    unsigned char* p = take(n, 1);
    if (p != nullptr) std::memcpy(p, s, n);
    return reinterpret_cast<const char*>(p);
  }
};

// Copy the strings and arrays that `src` (a struct of `desc`) points to and
// repoint `dst` (already a bitwise copy of src; nullptr when not written).
void copy_pointees(Arena& arena, const StructDesc& desc, const void* src, void* dst) {
  for (uint32_t i = 0; i < desc.field_count; ++i) {
    const FieldDesc& f = desc.fields[i];
    if (f.type == FieldType::str || f.type == FieldType::json_str) {
      const char* copy = arena.str(field_ref<const char*>(src, f));
      if (dst != nullptr) field_ref<const char*>(dst, f) = copy;
    } else if (f.type == FieldType::size) {
      if (dst != nullptr) field_ref<uint32_t>(dst, f) = desc.size;
    } else if (f.type == FieldType::array) {
      const uint32_t n = *reinterpret_cast<const uint32_t*>(static_cast<const unsigned char*>(src) +
                                                            f.count_offset);
      const auto* elems = static_cast<const unsigned char*>(field_ref<const void*>(src, f));
      const StructDesc& e = *f.elem;
      unsigned char* out = arena.take(size_t{n} * e.size, e.align);
      if (out != nullptr && n > 0) std::memcpy(out, elems, size_t{n} * e.size);
      if (dst != nullptr) field_ref<const void*>(dst, f) = n > 0 ? out : nullptr;
      for (uint32_t k = 0; k < n; ++k)
        copy_pointees(arena, e, elems + size_t{k} * e.size, out != nullptr ? out + size_t{k} * e.size : nullptr);
    }
  }
}

void walk(Arena& arena, const ballast_event& ev, ballast_event* out) {
  // The payload goes first: the buffer's start is aligned for any struct.
  const StructDesc* desc = struct_for_schema(ev.schema);
  const void* payload = nullptr;
  uint64_t payload_size = 0;
  if (desc != nullptr) {
    unsigned char* p = arena.take(desc->size, desc->align);
    if (p != nullptr) std::memcpy(p, ev.payload, desc->size);
    copy_pointees(arena, *desc, ev.payload, p);
    payload = p;
    payload_size = desc->size;
  } else if (ev.payload_size > 0) {
    unsigned char* p = arena.take(ev.payload_size + 1, 1);
    if (p != nullptr) {
      std::memcpy(p, ev.payload, ev.payload_size);
      p[ev.payload_size] = 0;
    }
    payload = p;
    payload_size = ev.payload_size;
  }
  const char* topic = arena.str(ev.topic);
  const char* node = arena.str(ev.source.node);
  const char* plugin = arena.str(ev.source.plugin);
  if (arena.fits()) {
    *out = ballast_event{};
    out->size = sizeof(ballast_event);
    out->schema = ev.schema;
    out->topic = topic;
    out->ts_ns = ev.ts_ns;
    out->source = ballast_source{node, ev.source.rank, plugin};
    out->payload = payload;
    out->payload_size = payload_size;
  }
}

bool has_arrays(const StructDesc& desc) {
  for (uint32_t i = 0; i < desc.field_count; ++i)
    if (desc.fields[i].type == FieldType::array) return true;
  return false;
}

bool check_struct(const StructDesc& desc, const void* base, const char** why) {
  for (uint32_t i = 0; i < desc.field_count; ++i) {
    const FieldDesc& f = desc.fields[i];
    if (f.type != FieldType::array) continue;
    const uint32_t n = *reinterpret_cast<const uint32_t*>(static_cast<const unsigned char*>(base) +
                                                          f.count_offset);
    const auto* elems = static_cast<const unsigned char*>(field_ref<const void*>(base, f));
    if (n > 0 && elems == nullptr) {
      *why = "payload array is NULL but its count is not 0";
      return false;
    }
    // Elements are only walked when they hold arrays themselves (none do in
    // v1), so that checking a batch costs the same for any count.
    if (!has_arrays(*f.elem)) continue;
    for (uint32_t k = 0; k < n; ++k)
      if (!check_struct(*f.elem, elems + size_t{k} * f.elem->size, why)) return false;
  }
  return true;
}

// `p` moved by `delta` bytes: computed on integers, since the result points
// into another buffer than `p` does.
template <typename T>
T* moved(T* p, std::ptrdiff_t delta) {
  return p == nullptr ? nullptr
                      : reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(delta));
}

// Shift every pointer of the struct at `base` (in the new buffer) by `delta`.
void shift_pointees(const StructDesc& desc, unsigned char* base, std::ptrdiff_t delta) {
  for (uint32_t i = 0; i < desc.field_count; ++i) {
    const FieldDesc& f = desc.fields[i];
    if (f.type == FieldType::str || f.type == FieldType::json_str) {
      const char*& p = field_ref<const char*>(base, f);
      p = moved(p, delta);
    } else if (f.type == FieldType::array) {
      const unsigned char*& p = field_ref<const unsigned char*>(base, f);
      if (p == nullptr) continue;
      p = moved(p, delta);
      const uint32_t n = *reinterpret_cast<const uint32_t*>(base + f.count_offset);
      auto* elems = const_cast<unsigned char*>(p);
      for (uint32_t k = 0; k < n; ++k) shift_pointees(*f.elem, elems + size_t{k} * f.elem->size, delta);
    }
  }
}

}  // namespace

void copy_flat(const ballast_event& flat, const unsigned char* from, size_t bytes, unsigned char* to,
               ballast_event* out) {
  std::memcpy(to, from, bytes);
  const auto delta = static_cast<std::ptrdiff_t>(reinterpret_cast<uintptr_t>(to) - reinterpret_cast<uintptr_t>(from));
  *out = flat;
  out->topic = moved(flat.topic, delta);
  out->source.node = moved(flat.source.node, delta);
  out->source.plugin = moved(flat.source.plugin, delta);
  if (flat.payload != nullptr) {
    out->payload = moved(flat.payload, delta);
    if (const StructDesc* desc = struct_for_schema(flat.schema))
      shift_pointees(*desc, const_cast<unsigned char*>(static_cast<const unsigned char*>(out->payload)), delta);
  }
}

bool check_event(const ballast_event& ev, const char** why) {
  if (ev.size < sizeof(ballast_event)) {
    *why = "event size is smaller than ballast_event v1";
    return false;
  }
  if (ev.topic == nullptr) {
    *why = "event topic is NULL";
    return false;
  }
  if (ev.payload_size > 0 && ev.payload == nullptr) {
    *why = "payload is NULL but payload_size is not 0";
    return false;
  }
  const StructDesc* desc = struct_for_schema(ev.schema);
  if (desc == nullptr) return true;
  if (ev.payload == nullptr || ev.payload_size < desc->size) {
    *why = "payload is smaller than the struct of its well-known schema";
    return false;
  }
  if (*static_cast<const uint32_t*>(ev.payload) < desc->size) {
    *why = "payload size field is smaller than the struct of its well-known schema";
    return false;
  }
  // The top-level arrays, found once from the field tables: publish checks
  // every event, so this path stays a few loads.
  struct Arrays {
    uint32_t n = 0;
    uint32_t count_offset[2] = {};
    uint32_t ptr_offset[2] = {};
    bool deep = false;  // elements or extra arrays need the full walk
  };
  static const auto kArrays = [] {
    std::array<Arrays, BALLAST_SCHEMA_STRAGGLER_REPORT + 1> t{};
    for (uint32_t schema = 0; schema < t.size(); ++schema) {
      const StructDesc* d = struct_for_schema(schema);
      for (uint32_t i = 0; d != nullptr && i < d->field_count; ++i) {
        const FieldDesc& f = d->fields[i];
        if (f.type != FieldType::array) continue;
        Arrays& a = t[schema];
        if (a.n == 2 || has_arrays(*f.elem)) {
          a.deep = true;
          continue;
        }
        a.count_offset[a.n] = f.count_offset;
        a.ptr_offset[a.n] = f.offset;
        ++a.n;
      }
    }
    return t;
  }();
  if (ev.schema >= kArrays.size()) return check_struct(*desc, ev.payload, why);
  const Arrays& a = kArrays[ev.schema];
  if (a.deep) return check_struct(*desc, ev.payload, why);
  const auto* base = static_cast<const unsigned char*>(ev.payload);
  for (uint32_t i = 0; i < a.n; ++i) {
    uint32_t count;
    const void* ptr;
    std::memcpy(&count, base + a.count_offset[i], sizeof count);
    std::memcpy(&ptr, base + a.ptr_offset[i], sizeof ptr);
    if (count > 0 && ptr == nullptr) {
      *why = "payload array is NULL but its count is not 0";
      return false;
    }
  }
  return true;
}

size_t flat_size(const ballast_event& event) {
  Arena arena;
  walk(arena, event, nullptr);
  return arena.used;
}

void flatten(const ballast_event& event, unsigned char* buf, ballast_event* out) {
  Arena arena;
  arena.base = buf;
  walk(arena, event, out);
}

bool flatten_into(const ballast_event& event, unsigned char* buf, size_t cap, ballast_event* out, size_t* needed) {
  Arena arena;
  arena.base = buf;
  arena.cap = cap;
  walk(arena, event, out);
  *needed = arena.used;
  return arena.fits();
}

}  // namespace ballast::codec
