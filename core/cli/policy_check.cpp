// ballast policy check SCRIPT.lua [--events FILE]: a dry run of a recovery
// policy against recorded events, printing the actions it takes. Exits 1 when
// the policy fails on any event, so it can guard a policy change in CI.
#include "commands.hpp"

#include "error.hpp"
#include "event_file.hpp"
#include "policy.hpp"

#include <cstdio>

namespace ballast::cli {

namespace {

class PrintSink : public PolicySink {
 public:
  explicit PrintSink(bool json) : json_(json) {}
  const ballast_event* current = nullptr;
  int errors = 0;
  int actions = 0;

  void on_action(const PolicyAction& a) override {
    ++actions;
    nlohmann::json args = nlohmann::json::parse(a.args_json.empty() ? "{}" : a.args_json, nullptr, false);
    if (json_) {
      nlohmann::json j = {{"ts", current ? current->ts_ns / 1e9 : 0.0},
                          {"cause", a.cause_topic},
                          {"action", a.action},
                          {"subject", a.subject},
                          {"reason", a.reason},
                          {"args", args.is_discarded() ? nlohmann::json(a.args_json) : args},
                          {"fallback", a.fallback}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("%-28s -> %s%s %s%s%s\n", a.cause_topic.c_str(), a.fallback ? "(fallback) " : "", a.action.c_str(),
                  a.subject.empty() ? "(job)" : a.subject.c_str(), a.reason.empty() ? "" : ": ", a.reason.c_str());
    }
  }
  void on_publish(OwnedEvent event) override {
    const ballast_event& e = event.view();
    const nlohmann::json payload = event_to_json(e)["payload"];
    if (json_)
      std::printf("%s\n", nlohmann::json{{"publish", e.topic}, {"payload", payload}}
                              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                              .c_str());
    else
      std::printf("%-28s publishes %s %s\n", current && current->topic ? current->topic : "", e.topic,
                  payload.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  void on_log(int level, const std::string& message) override {
    static const char* names[] = {"error", "warn", "info", "debug"};
    std::fprintf(stderr, "policy %s: %s\n", names[level < 0 || level > 3 ? 3 : level], message.c_str());
  }
  void on_error(const std::string& message) override {
    ++errors;
    std::fprintf(stderr, "policy error: %s\n", message.c_str());
  }

 private:
  bool json_;
};

}  // namespace

void add_policy(CLI::App& app) {
  auto* policy = app.add_subcommand("policy", "Work with Lua recovery policies");
  policy->require_subcommand(1);
  auto* check = policy->add_subcommand("check", "Load a policy and replay recorded events through it (dry run)");
  static std::string script, events_file, fallback = "escalate";
  static bool json = false;
  static unsigned deadline_ms = 100;
  check->add_option("SCRIPT", script, "The policy script (.lua)")->required();
  check->add_option("--events", events_file, "A journal or a JSON-lines file of events");
  check->add_option("--fallback", fallback, "Action taken when the policy fails");
  check->add_option("--deadline-ms", deadline_ms, "Wall-clock budget per handler call");
  check->add_flag("--json", json, "Print actions as JSON lines");
  check->callback([] {
    PolicyOptions options;
    options.fallback_action = fallback;
    options.call_deadline_ms = deadline_ms;
    std::unique_ptr<Policy> p;
    if (Policy::load(script, options, &p) != BALLAST_OK) {
      std::fprintf(stderr, "ballast policy check: %s\n", last_error());
      set_exit_code(1);
      return;
    }
    PrintSink sink(json);
    size_t events = 0;
    if (!events_file.empty()) {
      int rc = read_event_file(events_file, [&](const OwnedEvent& ev) {
        ++events;
        sink.current = &ev.view();
        p->handle(ev.view(), sink);
        sink.current = nullptr;
      });
      if (rc != BALLAST_OK) {
        std::fprintf(stderr, "ballast policy check: %s\n", last_error());
        set_exit_code(1);
        return;
      }
    }
    std::string handlers;
    for (auto& pat : p->patterns()) handlers += (handlers.empty() ? "" : ", ") + pat;
    std::fprintf(stderr, "ballast policy check: %s: handlers for [%s]; %zu event(s), %d action(s), %d error(s)\n",
                 script.c_str(), handlers.c_str(), events, sink.actions, sink.errors);
    set_exit_code(sink.errors == 0 ? 0 : 1);
  });
}

}  // namespace ballast::cli
