// The executor's side of the relayed job channel (relay.hpp): reports that
// reached it as job.rank_report events from the nodes' agents go through the
// same parser and state machine as those of its own socket, once they are
// known to come from where the rank runs, in the current attempt.
#include "executor.hpp"
#include "relay.hpp"

#include <nlohmann/json.hpp>

#include <utility>

namespace ballast::runner {

std::string Executor::job_socket(int node) const {
  if (cfg_.relay_socket.empty()) return socket_path_;
  return relay_socket_of(cfg_.relay_socket, slots_[size_t(node_slot_[size_t(node)])].name);
}

void Executor::handle_relayed(const Message& m) {
  const auto refuse = [&](const char* counter, int level, const std::string& why) {
    host_->counter_add(host_, counter, 1);
    if (log_refusal(++relay_refused_))
      log(level, "relayed report refused: " + why + " (" + std::to_string(relay_refused_) + " refused so far)");
  };
  const nlohmann::json j = nlohmann::json::parse(m.text, nullptr, false);
  if (!j.is_object() || !j.contains("node") || !j["node"].is_string() || !j.contains("datagram") ||
      !j["datagram"].is_string() || !j.contains("received_ns") || !j["received_ns"].is_number_integer()) {
    refuse("relay.bad", BALLAST_LOG_WARN, "a job.rank_report without node, received_ns and datagram");
    return;
  }
  const std::string node = j["node"].get<std::string>();
  std::string why;
  const auto r = parse_report(j["datagram"].get<std::string>(), cfg_.ranks, &why);
  if (!r) {
    refuse("relay.bad", BALLAST_LOG_WARN, "from node " + node + ": " + why);
    return;
  }
  const std::string what = r->type + " of rank " + std::to_string(r->rank) + " from node " + node;
  // Received before this attempt started: a rank of an earlier attempt said
  // it (the agents' clocks are the controller's, through NTP).
  if (ended_ || attempt_ < 0 || j["received_ns"].get<int64_t>() < attempt_start_wall_ns_) {
    refuse("relay.stale", BALLAST_LOG_DEBUG, what + ": of an earlier attempt");
    return;
  }
  const int job_node = r->rank / cfg_.ranks_per_node;
  const std::string& placed = slots_[size_t(node_slot_[size_t(job_node)])].name;
  if (placed != node) {
    refuse("relay.misplaced", BALLAST_LOG_WARN,
           what + ": the rank runs on " + placed + " in attempt " + std::to_string(attempt_));
    return;
  }
  if (r->type == "step" && r->step <= ranks_[size_t(r->rank)].last_step) {
    refuse("relay.repeated", BALLAST_LOG_WARN,
           what + ": step " + std::to_string(r->step) + " again (the rank is at step " +
               std::to_string(ranks_[size_t(r->rank)].last_step) + ")");
    return;
  }
  host_->counter_add(host_, "relay.applied", 1);
  handle_report(*r);
}

// A controller leads (its agents connect and resend what their spools hold)
// before its executor has taken the job over: the executor tries when the
// term's event comes, but no sooner than a second after its start or after
// a try the fence refused, and reports read in the same pass as that event
// precede the try. Those reports are this term's, acknowledged to the
// agents, so they wait and are judged once the executor leads, as any.
// Bounded in bytes: past it the oldest are dropped, counted and logged.
void Executor::hold_relayed(Message m) {
  host_->counter_add(host_, "relay.held", 1);
  held_relayed_bytes_ += m.text.size();
  held_relayed_.push_back(std::move(m));
  while (held_relayed_bytes_ > kMaxHeldRelayedBytes) {
    held_relayed_bytes_ -= held_relayed_.front().text.size();
    held_relayed_.pop_front();
    host_->counter_add(host_, "relay.dropped_waiting", 1);
    if (log_refusal(++relay_refused_))
      log(BALLAST_LOG_WARN, "relayed report dropped: more than " + std::to_string(kMaxHeldRelayedBytes >> 20) +
                                " MiB of them came while waiting to lead (" + std::to_string(relay_refused_) +
                                " refused so far)");
  }
}

std::deque<Executor::Message> Executor::take_held_relayed() {
  held_relayed_bytes_ = 0;
  return std::exchange(held_relayed_, {});
}

}  // namespace ballast::runner
