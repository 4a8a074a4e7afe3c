#include "lua_event.hpp"

#include <cstring>
#include <iterator>

namespace ballast {

namespace {

// The well-known struct behind the payload, or nullptr when the payload is
// shorter than the struct (every field of events.h is there since v1.0).
template <typename T>
const T* well_known(const ballast_event& e) {
  if (e.payload == nullptr || e.payload_size < sizeof(T)) return nullptr;
  const T* p = static_cast<const T*>(e.payload);
  return p->size >= sizeof(T) ? p : nullptr;
}

bool payload_is_valid(const ballast_event& e) {
  switch (e.schema) {
    case BALLAST_SCHEMA_METRIC_BATCH: {
      auto* b = well_known<ballast_metric_batch>(e);
      return b != nullptr && (b->count == 0 || b->samples != nullptr);
    }
    case BALLAST_SCHEMA_OP_TIMING_BATCH: {
      auto* b = well_known<ballast_op_timing_batch>(e);
      return b != nullptr && (b->count == 0 || b->ops != nullptr);
    }
    case BALLAST_SCHEMA_COLLECTIVE_RECORD: return well_known<ballast_collective_record>(e) != nullptr;
    case BALLAST_SCHEMA_FAULT_REPORT: return well_known<ballast_fault_report>(e) != nullptr;
    case BALLAST_SCHEMA_PLACEMENT_PLAN: {
      auto* p = well_known<ballast_placement_plan>(e);
      return p != nullptr && (p->count == 0 || p->nodes != nullptr);
    }
    case BALLAST_SCHEMA_RECOVERY_ACTION: return well_known<ballast_recovery_action>(e) != nullptr;
    case BALLAST_SCHEMA_STARTUP_STAGE: return well_known<ballast_startup_stage>(e) != nullptr;
    case BALLAST_SCHEMA_STRAGGLER_REPORT: {
      auto* r = well_known<ballast_straggler_report>(e);
      return r != nullptr && (r->count == 0 || r->culprits != nullptr);
    }
    default: return true;
  }
}

// Parse a JSON string field; on failure it is delivered as text.
int parse_part(EventConversion* c, const char* text, const char* what) {
  if (text == nullptr) return -1;
  std::string error;
  int root = c->tape.parse(text, &error);
  if (root < 0) c->warning = std::string(what) + " is not valid JSON, delivered as text: " + error;
  return root;
}

// ---- table builders (protected mode: these allocate Lua objects) ----------

// Field names are interned once per state, as the upvalues of the event
// closure (upvalue key + 1), and set with lua_rawset: no hashing or lookup
// of C strings per field.
enum Key : int { K_count, K_node, K_metric, K_ts_ns, K_value, K_flags, K_dp_rank, K_stage, K_rank, K_step, K_optype, K_start_s, K_duration_s, K_seq_id, K_mc, K_mb_id, K_gmc, K_state, K_comm_id, K_seq, K_op, K_dtype, K_algorithm, K_bytes, K_nranks, K_peer, K_status, K_issue_ns, K_start_ns, K_end_ns, K_chunks_posted, K_chunks_sent, K_chunks_received, K_chunks_reduced, K_subject, K_kind, K_score, K_confidence, K_since_ns, K_detected_ns, K_evidence, K_detector, K_job, K_name, K_pp_stage, K_dp_row, K_first_rank, K_max_dp_spread, K_max_pp_spread, K_objective, K_lower_bound, K_action, K_reason, K_args, K_policy, K_cause_topic, K_slowdown, K_launch_slowdown, K_dimension, K_first_step, K_last_step, K_topic, K_ts, K_schema, K_plugin, K_samples, K_ops, K_nodes, K_culprits, K_source, K_payload, kKeyCount };
const char* const kKeyNames[] = {"count", "node", "metric", "ts_ns", "value", "flags", "dp_rank", "stage", "rank", "step", "optype", "start_s", "duration_s", "seq_id", "mc", "mb_id", "gmc", "state", "comm_id", "seq", "op", "dtype", "algorithm", "bytes", "nranks", "peer", "status", "issue_ns", "start_ns", "end_ns", "chunks_posted", "chunks_sent", "chunks_received", "chunks_reduced", "subject", "kind", "score", "confidence", "since_ns", "detected_ns", "evidence", "detector", "job", "name", "pp_stage", "dp_row", "first_rank", "max_dp_spread", "max_pp_spread", "objective", "lower_bound", "action", "reason", "args", "policy", "cause_topic", "slowdown", "launch_slowdown", "dimension", "first_step", "last_step", "topic", "ts", "schema", "plugin", "samples", "ops", "nodes", "culprits", "source", "payload"};
static_assert(std::size(kKeyNames) == kKeyCount && kKeyCount <= 255, "one upvalue per key");
char kClosureKey;  // registry: the event closure

void push_key(lua_State* L, Key key) { lua_pushvalue(L, lua_upvalueindex(key + 1)); }

// t[key] = value, with t below the value at the top.
void set_top(lua_State* L, Key key) {
  push_key(L, key);
  lua_insert(L, -2);
  lua_rawset(L, -3);
}

// Key first, then the value: no stack rotation.
void set_s(lua_State* L, Key key, const char* value) {
  if (value == nullptr) return;
  push_key(L, key);
  lua_pushstring(L, value);
  lua_rawset(L, -3);
}

void set_i(lua_State* L, Key key, int64_t value) {
  push_key(L, key);
  lua_pushinteger(L, lua_Integer(value));
  lua_rawset(L, -3);
}

void set_u(lua_State* L, Key key, uint64_t value) {
  push_key(L, key);
  lua_pushinteger(L, lua_Integer(value));  // ids keep their bits
  lua_rawset(L, -3);
}

void set_n(lua_State* L, Key key, double value) {
  push_key(L, key);
  lua_pushnumber(L, value);
  lua_rawset(L, -3);
}

// A JSON text field: its table when it parsed, else the text.
void set_json(lua_State* L, const EventConversion& c, Key key, const char* text, int root) {
  if (text == nullptr) return;
  if (root >= 0) {
    c.tape.push(L, root);
  } else {
    lua_pushstring(L, text);
  }
  set_top(L, key);
}

const char* collective_state(uint32_t s) {
  switch (s) {
    case BALLAST_COLL_ISSUED: return "issued";
    case BALLAST_COLL_STARTED: return "started";
    case BALLAST_COLL_DONE: return "done";
    case BALLAST_COLL_FAILED: return "failed";
    default: return nullptr;
  }
}

void push_metric_batch(lua_State* L, const ballast_metric_batch& b) {
  lua_createtable(L, 0, 2);
  set_i(L, K_count, b.count);
  lua_createtable(L, int(b.count), 0);
  for (uint32_t i = 0; i < b.count; ++i) {
    const ballast_metric_sample& s = b.samples[i];
    lua_createtable(L, 0, 5);
    set_s(L, K_node, s.node);
    set_s(L, K_metric, s.metric);
    set_i(L, K_ts_ns, s.ts_ns);
    set_n(L, K_value, s.value);
    set_i(L, K_flags, s.flags);
    lua_rawseti(L, -2, lua_Integer(i) + 1);
  }
  set_top(L, K_samples);
}

void push_op_timing_batch(lua_State* L, const ballast_op_timing_batch& b) {
  lua_createtable(L, 0, 2);
  set_i(L, K_count, b.count);
  lua_createtable(L, int(b.count), 0);
  for (uint32_t i = 0; i < b.count; ++i) {
    const ballast_op_timing& o = b.ops[i];
    lua_createtable(L, 0, 11);
    set_i(L, K_dp_rank, o.dp_rank);
    set_i(L, K_stage, o.stage);
    set_i(L, K_rank, o.rank);
    set_i(L, K_step, o.step);
    set_s(L, K_optype, o.optype);
    set_n(L, K_start_s, o.start_s);
    set_n(L, K_duration_s, o.duration_s);
    set_i(L, K_seq_id, o.seq_id);
    set_i(L, K_mc, o.mc);
    set_i(L, K_mb_id, o.mb_id);
    set_i(L, K_gmc, o.gmc);
    lua_rawseti(L, -2, lua_Integer(i) + 1);
  }
  set_top(L, K_ops);
}

void push_collective_record(lua_State* L, const ballast_collective_record& r) {
  lua_createtable(L, 0, 20);
  if (const char* s = collective_state(r.state)) {
    set_s(L, K_state, s);
  } else {
    set_i(L, K_state, r.state);
  }
  set_u(L, K_comm_id, r.comm_id);
  set_u(L, K_seq, r.seq);
  set_s(L, K_op, r.op);
  set_s(L, K_dtype, r.dtype);
  set_s(L, K_algorithm, r.algorithm);
  set_u(L, K_count, r.count);
  set_u(L, K_bytes, r.bytes);
  set_i(L, K_rank, r.rank);
  set_i(L, K_nranks, r.nranks);
  set_i(L, K_peer, r.peer);
  set_i(L, K_status, r.status);
  set_i(L, K_issue_ns, r.issue_ns);
  set_i(L, K_start_ns, r.start_ns);
  set_i(L, K_end_ns, r.end_ns);
  set_u(L, K_chunks_posted, r.chunks_posted);
  set_u(L, K_chunks_sent, r.chunks_sent);
  set_u(L, K_chunks_received, r.chunks_received);
  set_u(L, K_chunks_reduced, r.chunks_reduced);
}

void push_fault_report(lua_State* L, const EventConversion& c, const ballast_fault_report& f) {
  lua_createtable(L, 0, 11);
  if (f.stage == BALLAST_FAULT_SUSPECTED || f.stage == BALLAST_FAULT_CONFIRMED) {
    set_s(L, K_stage, f.stage == BALLAST_FAULT_SUSPECTED ? "suspected" : "confirmed");
  } else {
    set_i(L, K_stage, f.stage);
  }
  set_s(L, K_subject, f.subject);
  set_i(L, K_rank, f.rank);
  set_s(L, K_kind, f.kind);
  set_s(L, K_metric, f.metric);
  set_n(L, K_score, f.score);
  set_n(L, K_confidence, f.confidence);
  set_i(L, K_since_ns, f.since_ns);
  set_i(L, K_detected_ns, f.detected_ns);
  set_json(L, c, K_evidence, f.evidence, c.evidence_root);
  set_s(L, K_detector, f.detector);
}

void push_placement_plan(lua_State* L, const ballast_placement_plan& p) {
  lua_createtable(L, 0, 8);
  set_i(L, K_count, p.count);
  set_s(L, K_job, p.job);
  set_s(L, K_algorithm, p.algorithm);
  lua_createtable(L, int(p.count), 0);
  for (uint32_t i = 0; i < p.count; ++i) {
    const ballast_placement_node& n = p.nodes[i];
    lua_createtable(L, 0, 4);
    set_s(L, K_name, n.name);
    set_i(L, K_pp_stage, n.pp_stage);
    set_i(L, K_dp_row, n.dp_row);
    set_i(L, K_first_rank, n.first_rank);
    lua_rawseti(L, -2, lua_Integer(i) + 1);
  }
  set_top(L, K_nodes);
  set_i(L, K_max_dp_spread, p.max_dp_spread);
  set_i(L, K_max_pp_spread, p.max_pp_spread);
  set_n(L, K_objective, p.objective);
  set_n(L, K_lower_bound, p.lower_bound);
}

void push_recovery_action(lua_State* L, const EventConversion& c, const ballast_recovery_action& a) {
  lua_createtable(L, 0, 6);
  set_s(L, K_action, a.action);
  set_s(L, K_subject, a.subject);
  set_s(L, K_reason, a.reason);
  set_json(L, c, K_args, a.args, c.args_root);
  set_s(L, K_policy, a.policy);
  set_s(L, K_cause_topic, a.cause_topic);
}

void push_startup_stage(lua_State* L, const ballast_startup_stage& s) {
  lua_createtable(L, 0, 7);
  set_i(L, K_status, s.status);
  set_s(L, K_stage, s.stage);
  set_s(L, K_node, s.node);
  set_i(L, K_rank, s.rank);
  set_i(L, K_start_ns, s.start_ns);
  set_i(L, K_end_ns, s.end_ns);
  set_u(L, K_bytes, s.bytes);
}

void push_straggler_report(lua_State* L, const ballast_straggler_report& r) {
  lua_createtable(L, 0, 7);
  set_i(L, K_count, r.count);
  set_n(L, K_slowdown, r.slowdown);
  set_n(L, K_launch_slowdown, r.launch_slowdown);
  set_s(L, K_kind, r.kind);
  lua_createtable(L, int(r.count), 0);
  for (uint32_t i = 0; i < r.count; ++i) {
    const ballast_straggler_culprit& k = r.culprits[i];
    lua_createtable(L, 0, 3);
    set_s(L, K_dimension, k.dimension);
    set_s(L, K_name, k.name);
    set_n(L, K_slowdown, k.slowdown);
    lua_rawseti(L, -2, lua_Integer(i) + 1);
  }
  set_top(L, K_culprits);
  set_i(L, K_first_step, r.first_step);
  set_i(L, K_last_step, r.last_step);
}

// Pushes the payload, or nothing; returns whether it pushed.
bool push_payload(lua_State* L, const EventConversion& c) {
  const ballast_event& e = *c.event;
  const void* p = e.payload;
  switch (e.schema) {
    case BALLAST_SCHEMA_NONE: return false;
    case BALLAST_SCHEMA_JSON:
      if (c.payload_root >= 0) {
        c.tape.push(L, c.payload_root);
        return true;
      }
      break;  // invalid JSON: the bytes as text
    case BALLAST_SCHEMA_METRIC_BATCH:
      push_metric_batch(L, *static_cast<const ballast_metric_batch*>(p));
      return true;
    case BALLAST_SCHEMA_OP_TIMING_BATCH:
      push_op_timing_batch(L, *static_cast<const ballast_op_timing_batch*>(p));
      return true;
    case BALLAST_SCHEMA_COLLECTIVE_RECORD:
      push_collective_record(L, *static_cast<const ballast_collective_record*>(p));
      return true;
    case BALLAST_SCHEMA_FAULT_REPORT:
      push_fault_report(L, c, *static_cast<const ballast_fault_report*>(p));
      return true;
    case BALLAST_SCHEMA_PLACEMENT_PLAN:
      push_placement_plan(L, *static_cast<const ballast_placement_plan*>(p));
      return true;
    case BALLAST_SCHEMA_RECOVERY_ACTION:
      push_recovery_action(L, c, *static_cast<const ballast_recovery_action*>(p));
      return true;
    case BALLAST_SCHEMA_STARTUP_STAGE:
      push_startup_stage(L, *static_cast<const ballast_startup_stage*>(p));
      return true;
    case BALLAST_SCHEMA_STRAGGLER_REPORT:
      push_straggler_report(L, *static_cast<const ballast_straggler_report*>(p));
      return true;
    default: break;
  }
  if (p == nullptr || e.payload_size == 0) return false;
  lua_pushlstring(L, static_cast<const char*>(p), size_t(e.payload_size));
  return true;
}

}  // namespace

void prepare_event(const ballast_event& event, EventConversion* c) {
  c->event = &event;
  c->tape.clear();
  c->payload_root = c->evidence_root = c->args_root = -1;
  c->drop_payload = false;
  c->warning.clear();
  if (!payload_is_valid(event)) {
    c->drop_payload = true;
    c->warning = "event '" + std::string(event.topic != nullptr ? event.topic : "") +
                 "': payload of schema " + std::to_string(event.schema) +
                 " is shorter than its struct or lacks its array; delivered without payload";
    return;
  }
  switch (event.schema) {
    case BALLAST_SCHEMA_JSON:
      if (event.payload != nullptr && event.payload_size > 0) {
        std::string error;
        c->payload_root = c->tape.parse(
            std::string_view(static_cast<const char*>(event.payload), size_t(event.payload_size)), &error);
        if (c->payload_root < 0) c->warning = "JSON payload is not valid JSON, delivered as text: " + error;
      }
      break;
    case BALLAST_SCHEMA_FAULT_REPORT:
      c->evidence_root =
          parse_part(c, static_cast<const ballast_fault_report*>(event.payload)->evidence, "evidence");
      break;
    case BALLAST_SCHEMA_RECOVERY_ACTION:
      c->args_root = parse_part(c, static_cast<const ballast_recovery_action*>(event.payload)->args, "args");
      break;
    default: break;
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
  luaL_checkstack(L, kKeyCount + 1, "event closure");
  for (int k = 0; k < kKeyCount; ++k) lua_pushstring(L, kKeyNames[k]);
  lua_pushcclosure(L, event_closure, kKeyCount);
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
