// Lua recovery policies (DESIGN.md "Lua policies").
//
// A policy is a Lua 5.4 script run in a sandbox: text-only load into an
// allow-listed read-only environment, every call under lua_pcall with a
// traceback, a wall-clock deadline per call enforced by an
// instruction-count hook (set when the deadline passes: lua_sandbox.hpp),
// and a memory cap through a custom allocator. The script registers
// handlers with ballast.on(pattern, fn); a handler receives the event as a
// table {topic=, ts=, source={node=,rank=,plugin=}, payload={...}} and may
// return an action table ({action="evict", subject="node7", reason="...",
// args={...}}) or a list of them, call ballast.publish(topic, table),
// ballast.log(level, msg) and ballast.now(). Patterns and topics follow the
// bus's grammar (topic.hpp), checked where the script names them.
//
// Everything a handler call hands out (publications, returned actions) is
// bounded in all: 4 MiB of strings and 100,000 values per call, and never
// more than the room left under the memory cap. Building the event's table
// does not count against the handler's deadline.
//
// Thread-safety: a Policy is used by one thread at a time (the policy plugin
// serialises its handler calls and reloads); reload() must be called from
// that thread or while no event is being handled; stop() from any thread.
#pragma once

#include "event_codec.hpp"

#include <ballast/event.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ballast {

inline const char* const kRecoveryActions[] = {"restart",        "evict", "replace", "rollback",
                                               "checkpoint_now", "pause", "escalate"};

struct PolicyOptions {
  std::string name;                          // for messages; default: the file's stem
  std::string fallback_action = "escalate";  // published when a call fails
  uint32_t call_deadline_ms = 100;           // wall clock per handler call
  uint64_t memory_limit_bytes = 64u << 20;   // cap of the Lua state
};

struct PolicyAction {
  std::string action;   // one of kRecoveryActions
  std::string subject;  // node/rank, may be empty
  std::string reason;
  std::string args_json;    // JSON object text, "{}" when none
  std::string cause_topic;  // topic of the event that triggered it
  bool fallback = false;    // true when produced by the fallback rule
};

// What a policy does to the world; the policy plugin implements it (publish
// on the bus: policy_plugin.cpp), `policy check` prints it.
class PolicySink {
 public:
  virtual ~PolicySink() = default;
  virtual void on_action(const PolicyAction& action) = 0;
  // ballast.publish(topic, table): the event, the table converted once to
  // the topic's well-known struct (or JSON for any other topic).
  virtual void on_publish(OwnedEvent event) = 0;
  virtual void on_log(int level, const std::string& message) = 0;
  // A script error, a blown deadline or the memory cap: the message has the
  // script, the line and the traceback when Lua gives them.
  virtual void on_error(const std::string& message) = 0;
};

class Policy {
 public:
  // Load and run the script's top level (which registers handlers). Status;
  // the message names the file and the line.
  static int load(const std::string& path, PolicyOptions options, std::unique_ptr<Policy>* out);
  ~Policy();

  // Re-read the file into a fresh state; on failure the old state stays.
  int reload();

  // The patterns the script registered, for subscribing on the bus.
  std::vector<std::string> patterns() const;

  // Run every handler matching event.topic, in registration order. Actions
  // and publications go to sink; a failure goes to sink.on_error and then
  // the fallback action is emitted. Returns the number of handlers run.
  int handle(const ballast_event& event, PolicySink& sink);

  // Stop the handler call in progress (it fails as "interrupted", within
  // 50 ms) and skip every later event, counting it (skipped()). Thread-safe:
  // for a host that stops without waiting for a stuck handler's deadline.
  void stop();
  uint64_t skipped() const;

  const std::string& path() const;
  const std::string& name() const;
  uint64_t memory_in_use() const;

 private:
  Policy();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ballast
