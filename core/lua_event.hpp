// An event as the Lua table a policy handler receives:
//
//   {topic=, ts= (seconds), ts_ns=, schema= (id), source={node=,rank=,plugin=},
//    payload=...}
//
// Well-known payloads (events.h) become tables with the structs' field names
// (arrays as sequences, enums as their names: stage "suspected"/"confirmed",
// state "issued"/"started"/"done"/"failed"); JSON text (the JSON schema,
// fault_report.evidence, recovery_action.args) becomes tables; any other
// schema the payload bytes as a string. A well-known payload shorter than
// its struct is left out (payload = nil) with a warning.
#pragma once

#include "lua_json.hpp"
#include "lua_sandbox.hpp"

#include <ballast/events.h>

#include <lua.hpp>

#include <string>

namespace ballast {

struct EventConversion {
  const ballast_event* event = nullptr;
  JsonTape tape;           // JSON parts, parsed before any Lua call
  int payload_root = -1;   // tape root of a JSON payload
  int evidence_root = -1;  // fault_report.evidence
  int args_root = -1;      // recovery_action.args
  bool drop_payload = false;
  bool built = false;      // set by the event closure
  std::string warning;     // why a part is delivered as text, or left out
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
