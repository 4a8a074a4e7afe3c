// An event as the Lua table a policy handler receives:
//
//   {topic=, ts= (seconds), ts_ns=, schema= (id), source={node=,rank=,plugin=},
//    payload=...}
//
// Well-known payloads (events.h) become tables with the structs' field names,
// walked from the schema tables of codec_schema.cpp (arrays as sequences,
// enums as their names: stage "suspected"/"confirmed", state
// "issued"/"started"/"done"/"failed"); JSON text (the JSON schema,
// fault_report.evidence, recovery_action.args) becomes tables; any other
// schema the payload bytes as a string. A payload that fails
// codec::check_event (shorter than its struct's v1 size, an array without its
// elements) is left out (payload = nil) with a warning; fields after the v1
// size that the publisher left out read as their default.
#pragma once

#include "codec_flat.hpp"
#include "lua_json.hpp"
#include "lua_sandbox.hpp"

#include <ballast/events.h>

#include <lua.hpp>

#include <string>
#include <vector>

namespace ballast {

struct LuaPlan;

struct EventConversion {
  const ballast_event* event = nullptr;
  JsonTape tape;                  // JSON parts, parsed before any Lua call
  int payload_root = -1;          // tape root of a JSON payload
  const LuaPlan* plan = nullptr;  // a well-known payload: how it becomes a table
  const void* payload = nullptr;  // ... and the whole struct (codec::whole_payload)
  codec::PayloadScratch scratch;
  std::vector<int> json_roots;  // per field of the struct: tape root of a JSON text field, or -1
  bool drop_payload = false;
  bool built = false;   // set by the event closure
  std::string warning;  // why a part is delivered as text, or left out
};

// C++ side: check the payload and parse its JSON parts into conv (reused
// across events: no allocation once warm).
void prepare_event(const ballast_event& event, EventConversion* conv);

// Push the state's event closure (made on first use, kept in the registry):
//   closure(conv) -> ev                 the event table of a prepared conv
//   closure(conv, handler) -> r, ev     also calls handler(ev), r its result
// conv is a light userdata; conv->built is set once the table is complete
// (false after a failure: the conversion failed, not the handler).
LuaFailure push_event_closure(LuaSandbox& sandbox, std::string* error);

}  // namespace ballast
