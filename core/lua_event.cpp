#include "lua_event.hpp"

#include "codec_flat.hpp"
#include "codec_schema.hpp"

#include <cstring>
#include <deque>
#include <iterator>
#include <vector>

namespace ballast {

using codec::field_ref;
using codec::FieldDesc;
using codec::FieldType;
using codec::StructDesc;

namespace {

// Parse a JSON string field; on failure it is delivered as text.
int parse_part(EventConversion* c, const char* text, const char* what) {
  if (text == nullptr) return -1;
  std::string error;
  int root = c->tape.parse(text, &error);
  if (root < 0) c->warning = std::string(what) + " is not valid JSON, delivered as text: " + error;
  return root;
}

// ---- keys -------------------------------------------------------------------

// Field names are interned once per state, as the upvalues of the event
// closure (upvalue key + 1), and set with lua_rawset: no hashing or lookup
// of C strings per field. The keys are the event's own and every field name
// of the schema tables (codec_schema.cpp).
enum EventKey : int { K_topic, K_ts, K_ts_ns, K_schema, K_source, K_node, K_rank, K_plugin, K_payload, kEventKeys };
const char* const kEventKeyNames[] = {"topic", "ts", "ts_ns", "schema", "source", "node", "rank", "plugin", "payload"};
static_assert(std::size(kEventKeyNames) == kEventKeys);

// How one struct becomes a table: its fields with their keys.
struct LuaField {
  const FieldDesc* field;
  int key;
  uint32_t index;  // in the struct's field table (EventConversion::json_roots)
};
}  // namespace

struct LuaPlan {
  const StructDesc* desc;
  std::vector<LuaField> fields;
  std::vector<const LuaPlan*> elem;   // per field: the plan of an array's element
  std::vector<uint32_t> json_fields;  // indices of the JSON text fields, parsed before the call
};

namespace {

struct LuaKeys {
  std::vector<const char*> names;
  std::deque<LuaPlan> plans;  // stable addresses
  std::vector<const LuaPlan*> by_schema;

  int key(const char* name) {
    for (size_t i = 0; i < names.size(); ++i)
      if (std::strcmp(names[i], name) == 0) return int(i);
    names.push_back(name);
    return int(names.size() - 1);
  }
  const LuaPlan* build(const StructDesc& desc) {
    LuaPlan& plan = plans.emplace_back();
    plan.desc = &desc;
    for (uint32_t i = 0; i < desc.field_count; ++i) {
      const FieldDesc& f = desc.fields[i];
      // The size field and reserved fields are not data.
      if (f.type == FieldType::size || std::strcmp(f.name, "reserved") == 0) continue;
      plan.fields.push_back(LuaField{&f, key(f.name), i});
      plan.elem.push_back(f.type == FieldType::array ? build(*f.elem) : nullptr);
      if (f.type == FieldType::json_str) plan.json_fields.push_back(i);
    }
    return &plan;
  }
  LuaKeys() {
    for (const char* n : kEventKeyNames) names.push_back(n);
    uint32_t count = 0;
    const StructDesc* const* structs = codec::well_known_structs(&count);
    for (uint32_t i = 0; i < count; ++i) {
      if (by_schema.size() <= structs[i]->schema) by_schema.resize(structs[i]->schema + 1, nullptr);
      by_schema[structs[i]->schema] = build(*structs[i]);
    }
  }
};

const LuaKeys& lua_keys() {
  static const LuaKeys keys;
  return keys;
}

char kClosureKey;  // registry: the event closure

// ---- table builders (protected mode: these allocate Lua objects) ----------

void push_key(lua_State* L, int key) { lua_pushvalue(L, lua_upvalueindex(key + 1)); }

// t[key] = value, with t below the value at the top.
void set_top(lua_State* L, int key) {
  push_key(L, key);
  lua_insert(L, -2);
  lua_rawset(L, -3);
}

// Key first, then the value: no stack rotation.
void set_s(lua_State* L, int key, const char* value) {
  if (value == nullptr) return;
  push_key(L, key);
  lua_pushstring(L, value);
  lua_rawset(L, -3);
}

void set_i(lua_State* L, int key, int64_t value) {
  push_key(L, key);
  lua_pushinteger(L, lua_Integer(value));
  lua_rawset(L, -3);
}

void set_u(lua_State* L, int key, uint64_t value) {
  push_key(L, key);
  lua_pushinteger(L, lua_Integer(value));  // ids keep their bits
  lua_rawset(L, -3);
}

void set_n(lua_State* L, int key, double value) {
  push_key(L, key);
  lua_pushnumber(L, value);
  lua_rawset(L, -3);
}

// A JSON text field: its table when it parsed, else the text.
void set_json(lua_State* L, const EventConversion& c, int key, const char* text, int root) {
  if (text == nullptr) return;
  if (root >= 0) {
    c.tape.push(L, root);
  } else {
    lua_pushstring(L, text);
  }
  set_top(L, key);
}

// The struct at `base` as a table, field by field from its plan. JSON text
// fields of the payload itself were parsed by prepare_event (top); those of
// array elements, if any, are delivered as text.
void push_struct(lua_State* L, const EventConversion& c, const LuaPlan& plan, const unsigned char* base, bool top) {
  lua_createtable(L, 0, int(plan.fields.size()));
  for (size_t i = 0; i < plan.fields.size(); ++i) {
    const LuaField& lf = plan.fields[i];
    const FieldDesc& f = *lf.field;
    switch (f.type) {
      case FieldType::size:
        break;
      case FieldType::count:
        set_i(L, lf.key, field_ref<uint32_t>(base, f));
        break;
      case FieldType::u32: {
        const uint32_t v = field_ref<uint32_t>(base, f);
        if (v < f.name_count) {
          set_s(L, lf.key, f.names[v]);
        } else {
          set_i(L, lf.key, v);
        }
        break;
      }
      case FieldType::i32:
        set_i(L, lf.key, field_ref<int32_t>(base, f));
        break;
      case FieldType::u64:
        set_u(L, lf.key, field_ref<uint64_t>(base, f));
        break;
      case FieldType::i64:
        set_i(L, lf.key, field_ref<int64_t>(base, f));
        break;
      case FieldType::f64:
        set_n(L, lf.key, field_ref<double>(base, f));
        break;
      case FieldType::str:
        set_s(L, lf.key, field_ref<const char*>(base, f));
        break;
      case FieldType::json_str:
        if (top) {
          set_json(L, c, lf.key, field_ref<const char*>(base, f), c.json_roots[lf.index]);
        } else {
          set_s(L, lf.key, field_ref<const char*>(base, f));
        }
        break;
      case FieldType::array: {
        uint32_t n;
        std::memcpy(&n, base + f.count_offset, sizeof n);
        const auto* elems = static_cast<const unsigned char*>(field_ref<const void*>(base, f));
        const LuaPlan& elem = *plan.elem[i];
        lua_createtable(L, int(n), 0);
        for (uint32_t k = 0; k < n; ++k) {
          push_struct(L, c, elem, elems + size_t{k} * f.elem->size, false);
          lua_rawseti(L, -2, lua_Integer(k) + 1);
        }
        set_top(L, lf.key);
        break;
      }
    }
  }
}

// Pushes the payload, or nothing; returns whether it pushed.
bool push_payload(lua_State* L, const EventConversion& c) {
  const ballast_event& e = *c.event;
  if (c.plan != nullptr) {
    push_struct(L, c, *c.plan, static_cast<const unsigned char*>(c.payload), true);
    return true;
  }
  if (e.schema == BALLAST_SCHEMA_NONE) return false;
  if (e.schema == BALLAST_SCHEMA_JSON && c.payload_root >= 0) {
    c.tape.push(L, c.payload_root);
    return true;
  }
  // Other schemas, and invalid JSON: the bytes as text.
  if (e.payload == nullptr || e.payload_size == 0) return false;
  lua_pushlstring(L, static_cast<const char*>(e.payload), size_t(e.payload_size));
  return true;
}

}  // namespace

void prepare_event(const ballast_event& event, EventConversion* c) {
  c->event = &event;
  c->tape.clear();
  c->payload_root = -1;
  c->plan = nullptr;
  c->payload = nullptr;
  c->drop_payload = false;
  c->warning.clear();
  const char* why = nullptr;
  if (!codec::check_event(event, &why)) {
    c->drop_payload = true;
    c->warning = "event '" + std::string(event.topic != nullptr ? event.topic : "") + "' (schema " +
                 std::to_string(event.schema) + "): " + why + "; delivered without payload";
    return;
  }
  const std::vector<const LuaPlan*>& plans = lua_keys().by_schema;
  if (const LuaPlan* plan = event.schema < plans.size() ? plans[event.schema] : nullptr) {
    c->plan = plan;
    c->payload = codec::whole_payload(event, &c->scratch);
    c->json_roots.assign(plan->desc->field_count, -1);
    for (uint32_t i : plan->json_fields) {
      const FieldDesc& f = plan->desc->fields[i];
      c->json_roots[i] = parse_part(c, field_ref<const char*>(c->payload, f), f.name);
    }
    return;
  }
  if (event.schema == BALLAST_SCHEMA_JSON && event.payload != nullptr && event.payload_size > 0) {
    std::string error;
    c->payload_root =
        c->tape.parse(std::string_view(static_cast<const char*>(event.payload), size_t(event.payload_size)), &error);
    if (c->payload_root < 0) c->warning = "JSON payload is not valid JSON, delivered as text: " + error;
  }
}

namespace {

// The event closure: closure(conv) -> ev, or closure(conv, handler) ->
// handler(ev), ev. Building the table inside the handler's protected call
// saves a protected call per event.
int event_closure(lua_State* L) {
  auto* c = static_cast<EventConversion*>(lua_touserdata(L, 1));
  const ballast_event& e = *c->event;
  lua_settop(L, 2);
  lua_createtable(L, 0, 6);
  set_s(L, K_topic, e.topic != nullptr ? e.topic : "");
  set_n(L, K_ts, double(e.ts_ns) / 1e9);
  set_i(L, K_ts_ns, e.ts_ns);
  set_i(L, K_schema, e.schema);
  lua_createtable(L, 0, 3);
  set_s(L, K_node, e.source.node);
  set_i(L, K_rank, e.source.rank);
  set_s(L, K_plugin, e.source.plugin);
  set_top(L, K_source);
  if (!c->drop_payload && push_payload(L, *c)) set_top(L, K_payload);
  c->built = true;
  // Building a large event's table is not the handler's work: its deadline
  // counts from here.
  LuaSandbox::restart_deadline(L);
  if (lua_type(L, 2) != LUA_TFUNCTION) return 1;
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_call(L, 1, 1);
  lua_pushvalue(L, 3);
  return 2;
}

int new_event_closure(lua_State* L) {
  const std::vector<const char*>& names = lua_keys().names;
  luaL_checkstack(L, int(names.size()) + 1, "event closure");
  for (const char* name : names) lua_pushstring(L, name);
  lua_pushcclosure(L, event_closure, int(names.size()));
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &kClosureKey);
  return 1;
}

}  // namespace

LuaFailure push_event_closure(LuaSandbox& sandbox, std::string* error) {
  lua_State* L = sandbox.state();
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &kClosureKey) == LUA_TFUNCTION) return LuaFailure::none;
  lua_pop(L, 1);
  return sandbox.protect(new_event_closure, nullptr, 1, error);
}

}  // namespace ballast
