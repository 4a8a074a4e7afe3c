#include "codec_flat.hpp"

#include "codec_schema.hpp"

#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ballast::codec {

namespace {

#if defined(__SSE2__)
// A mask of the zero bytes of the aligned 16-byte block at `block`.
// short_len() says why this load is not instrumented.
__attribute__((no_sanitize_address)) inline unsigned zero_bytes(uintptr_t block) {
  const __m128i bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(block));
  return static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(bytes, _mm_setzero_si128())));
}

// strlen(s) + 1 when the NUL lies in one of the two aligned 16-byte blocks
// that hold s's first bytes (so at most 32, and always for strings of up to
// 16 characters); 0 otherwise. Like strlen itself, it reads whole aligned
// blocks, so bytes around the string: never past a page the string does
// not reach, but ASan would report them. Publishing copies five short
// strings per metric sample; two calls each (strlen, memcpy) were a third
// of a queued publish.
size_t short_len(const char* s) {
  const auto addr = reinterpret_cast<uintptr_t>(s);
  const uintptr_t block = addr & ~uintptr_t{15};
  const unsigned skip = static_cast<unsigned>(addr & 15);
  unsigned zeros = zero_bytes(block) >> skip;
  if (zeros != 0) return static_cast<size_t>(__builtin_ctz(zeros)) + 1;
  // No NUL in the first block: the string goes on into the next one, which
  // is therefore mapped.
  zeros = zero_bytes(block + 16);
  if (zeros == 0) return 0;
  return 16 - skip + static_cast<size_t>(__builtin_ctz(zeros)) + 1;
}
#else
size_t short_len(const char*) { return 0; }
#endif

// Copy n bytes: up to 64 inline, as two overlapping fixed-size moves, instead
// of a call (the payload structs, their small arrays and the strings of an
// event are copied one by one).
inline void copy_bytes(unsigned char* d, const void* src, size_t n) {
  const auto* s = static_cast<const unsigned char*>(src);
  if (n > 64) {
    std::memcpy(d, s, n);
  } else if (n >= 32) {
    std::memcpy(d, s, 32);
    std::memcpy(d + n - 32, s + n - 32, 32);
  } else if (n >= 16) {
    std::memcpy(d, s, 16);
    std::memcpy(d + n - 16, s + n - 16, 16);
  } else if (n >= 8) {
    std::memcpy(d, s, 8);
    std::memcpy(d + n - 8, s + n - 8, 8);
  } else if (n >= 4) {
    std::memcpy(d, s, 4);
    std::memcpy(d + n - 4, s + n - 4, 4);
  } else if (n > 0) {
    d[0] = s[0];
    d[n / 2] = s[n / 2];
    d[n - 1] = s[n - 1];
  }
}

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
    if (const size_t n = short_len(s); n != 0) {
      unsigned char* p = take(n, 1);
      if (p != nullptr) copy_bytes(p, s, n);
      return reinterpret_cast<const char*>(p);
    }
    const size_t n = std::strlen(s) + 1;
    unsigned char* p = take(n, 1);
    if (p != nullptr) std::memcpy(p, s, n);
    return reinterpret_cast<const char*>(p);
  }
};

// What a copy of one struct does beyond its bitwise copy: the fields that
// point elsewhere (strings, arrays) and the size field, taken once from the
// field tables so that copies skip the scalar fields.
struct Plan;
struct Fixup {
  FieldType type;  // size, str, json_str or array
  uint32_t offset;
  uint32_t count_offset = 0;  // array: where its count lives
  const StructDesc* elem = nullptr;
  const Plan* elem_plan = nullptr;
};
struct Plan {
  const StructDesc* desc = nullptr;
  std::vector<Fixup> fixups;
};

// The plan of each well-known schema (nullptr for the others).
const Plan* plan_for_schema(uint32_t schema) {
  struct Plans {
    std::deque<Plan> all;  // stable addresses
    std::array<const Plan*, BALLAST_SCHEMA_STRAGGLER_REPORT + 1> by_schema{};
    const Plan* build(const StructDesc& desc) {
      Plan& plan = all.emplace_back();
      plan.desc = &desc;
      for (uint32_t i = 0; i < desc.field_count; ++i) {
        const FieldDesc& f = desc.fields[i];
        if (f.type == FieldType::size || f.type == FieldType::str || f.type == FieldType::json_str)
          plan.fixups.push_back(Fixup{f.type, f.offset});
        else if (f.type == FieldType::array)
          plan.fixups.push_back(Fixup{f.type, f.offset, f.count_offset, f.elem, build(*f.elem)});
      }
      return &plan;
    }
    Plans() {
      for (uint32_t schema = 0; schema < by_schema.size(); ++schema)
        if (const StructDesc* desc = struct_for_schema(schema)) by_schema[schema] = build(*desc);
    }
  };
  static const Plans plans;
  return schema < plans.by_schema.size() ? plans.by_schema[schema] : nullptr;
}

// Copy the strings and arrays that `src` (a struct of `plan`) points to and
// repoint `dst` (already a bitwise copy of src; nullptr when not written).
void copy_pointees(Arena& arena, const Plan& plan, const void* src, void* dst) {
  for (const Fixup& f : plan.fixups) {
    const auto* from = static_cast<const unsigned char*>(src) + f.offset;
    auto* to = dst != nullptr ? static_cast<unsigned char*>(dst) + f.offset : nullptr;
    if (f.type == FieldType::size) {
      if (to != nullptr) {
        const uint32_t size = plan.desc->size;
        std::memcpy(to, &size, sizeof size);
      }
    } else if (f.type == FieldType::array) {
      uint32_t n;
      std::memcpy(&n, static_cast<const unsigned char*>(src) + f.count_offset, sizeof n);
      const unsigned char* elems;
      std::memcpy(&elems, from, sizeof elems);
      const StructDesc& e = *f.elem;
      unsigned char* out = arena.take(size_t{n} * e.size, e.align);
      if (out != nullptr) copy_bytes(out, elems, size_t{n} * e.size);
      if (to != nullptr) {
        const unsigned char* ptr = n > 0 ? out : nullptr;
        std::memcpy(to, &ptr, sizeof ptr);
      }
      if (f.elem_plan->fixups.empty()) continue;
      for (uint32_t k = 0; k < n; ++k)
        copy_pointees(arena, *f.elem_plan, elems + size_t{k} * e.size,
                      out != nullptr ? out + size_t{k} * e.size : nullptr);
    } else {
      const char* str;
      std::memcpy(&str, from, sizeof str);
      const char* copy = arena.str(str);
      if (to != nullptr) std::memcpy(to, &copy, sizeof copy);
    }
  }
}

void walk(Arena& arena, const ballast_event& ev, const char* stable_topic, ballast_event* out) {
  // The payload goes first: the buffer's start is aligned for any struct.
  const Plan* plan = plan_for_schema(ev.schema);
  const void* payload = nullptr;
  uint64_t payload_size = 0;
  if (plan != nullptr) {
    const StructDesc& desc = *plan->desc;
    // A publisher of an older minor may leave fields out (rare): only then
    // is the payload padded to the whole struct.
    PayloadScratch scratch;
    const void* whole = ev.payload;
    if (ev.payload_size < desc.size || *static_cast<const uint32_t*>(ev.payload) < desc.size)
      whole = whole_payload(ev, &scratch);
    unsigned char* p = arena.take(desc.size, desc.align);
    if (p != nullptr) copy_bytes(p, whole, desc.size);
    copy_pointees(arena, *plan, whole, p);
    payload = p;
    payload_size = desc.size;
  } else if (ev.payload_size > 0) {
    unsigned char* p = arena.take(ev.payload_size + 1, 1);
    if (p != nullptr) {
      std::memcpy(p, ev.payload, ev.payload_size);
      p[ev.payload_size] = 0;
    }
    payload = p;
    payload_size = ev.payload_size;
  }
  const char* topic = stable_topic != nullptr ? stable_topic : arena.str(ev.topic);
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
    const uint32_t n = *reinterpret_cast<const uint32_t*>(static_cast<const unsigned char*>(base) + f.count_offset);
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
  return p == nullptr ? nullptr : reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(delta));
}

// Shift every pointer of the struct at `base` (in the new buffer) by `delta`.
void shift_pointees(const Plan& plan, unsigned char* base, std::ptrdiff_t delta) {
  for (const Fixup& f : plan.fixups) {
    if (f.type == FieldType::size) continue;
    const unsigned char* p;
    std::memcpy(&p, base + f.offset, sizeof p);
    if (p == nullptr) continue;
    p = moved(p, delta);
    std::memcpy(base + f.offset, &p, sizeof p);
    if (f.type != FieldType::array || f.elem_plan->fixups.empty()) continue;
    uint32_t n;
    std::memcpy(&n, base + f.count_offset, sizeof n);
    auto* elems = const_cast<unsigned char*>(p);
    for (uint32_t k = 0; k < n; ++k) shift_pointees(*f.elem_plan, elems + size_t{k} * f.elem->size, delta);
  }
}

}  // namespace

void copy_flat(const ballast_event& flat, const unsigned char* from, size_t bytes, unsigned char* to,
               ballast_event* out) {
  std::memcpy(to, from, bytes);
  const auto delta = static_cast<std::ptrdiff_t>(reinterpret_cast<uintptr_t>(to) - reinterpret_cast<uintptr_t>(from));
  // The topic may be a stable string outside the buffer (flatten's
  // stable_topic): only what lies in the buffer moves.
  const auto inside = [&](const char* p) {
    const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(from);
    return a >= b && a < b + bytes;
  };
  *out = flat;
  if (inside(flat.topic)) out->topic = moved(flat.topic, delta);
  out->source.node = moved(flat.source.node, delta);
  out->source.plugin = moved(flat.source.plugin, delta);
  if (flat.payload != nullptr) {
    out->payload = moved(flat.payload, delta);
    if (const Plan* plan = plan_for_schema(flat.schema))
      shift_pointees(*plan, const_cast<unsigned char*>(static_cast<const unsigned char*>(out->payload)), delta);
  }
}

namespace {
// The bytes of a well-known payload that its publisher wrote.
uint64_t payload_extent(const ballast_event& ev) {
  const uint32_t size = *static_cast<const uint32_t*>(ev.payload);
  return size < ev.payload_size ? size : ev.payload_size;
}
}  // namespace

const void* whole_payload(const ballast_event& ev, PayloadScratch* scratch) {
  const StructDesc* desc = struct_for_schema(ev.schema);
  const uint64_t have = payload_extent(ev);
  if (have >= desc->size) return ev.payload;
  std::memcpy(scratch->bytes, ev.payload, have);
  std::memset(scratch->bytes + have, 0, desc->size - have);
  return scratch->bytes;
}

bool check_event(const ballast_event& ev, const char** why) {
  if (ev.size < BALLAST_EVENT_V1_SIZE) {
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
  if (ev.payload == nullptr || ev.payload_size < desc->v1_size) {
    *why = "payload_size is smaller than the v1 size of its well-known schema's struct";
    return false;
  }
  if (*static_cast<const uint32_t*>(ev.payload) < desc->v1_size) {
    *why = "payload size field is smaller than the v1 size of its well-known schema's struct";
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

size_t flat_size(const ballast_event& event, const char* stable_topic) {
  Arena arena;
  walk(arena, event, stable_topic, nullptr);
  return arena.used;
}

void flatten(const ballast_event& event, unsigned char* buf, ballast_event* out, const char* stable_topic) {
  Arena arena;
  arena.base = buf;
  walk(arena, event, stable_topic, out);
}

bool flatten_into(const ballast_event& event, unsigned char* buf, size_t cap, ballast_event* out, size_t* needed,
                  const char* stable_topic) {
  Arena arena;
  arena.base = buf;
  arena.cap = cap;
  walk(arena, event, stable_topic, out);
  *needed = arena.used;
  return arena.fits();
}

}  // namespace ballast::codec
