#include "actions.hpp"

#include <cmath>

namespace ballast::runner {

bool restarts_job(const std::string& a) { return a == "restart" || a == "rollback" || a == "evict" || a == "replace"; }

bool known_action(const std::string& a) {
  return restarts_job(a) || a == "checkpoint_now" || a == "pause" || a == "escalate";
}

bool ActionQueue::push(Action a, uint64_t* merged_into) {
  if (a.name == "restart") {
    // A plain restart adds nothing to a queued action that restarts the job
    // anyway (a rollback or replace restarts it too, from where it must).
    for (const auto& q : queue_)
      if (restarts_job(q.name)) {
        *merged_into = q.id;
        return false;
      }
  }
  queue_.push_back(std::move(a));
  return true;
}

std::optional<Action> ActionQueue::pop_due(int64_t now_ns) {
  if (queue_.empty() || queue_.front().not_before_ns > now_ns) return std::nullopt;
  Action a = std::move(queue_.front());
  queue_.pop_front();
  return a;
}

bool ActionQueue::retry(Action a, int64_t now_ns) {
  ++a.tries;
  if (a.tries >= retry_.max_tries) return false;
  const double wait_s = retry_.backoff_s * std::pow(2.0, a.tries - 1);
  a.not_before_ns = now_ns + int64_t(wait_s * 1e9);
  queue_.push_front(std::move(a));
  return true;
}

int RestartLoop::note(const std::string& signature, int64_t step) {
  if (signature == signature_ && step <= step_) {
    ++count_;
  } else {
    signature_ = signature;
    count_ = 1;
  }
  step_ = step;
  return count_;
}

}  // namespace ballast::runner
