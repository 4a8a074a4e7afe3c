// The executor's bookkeeping of recovery actions, apart from carrying them
// out: a queue that never runs two actions on one job at once, retries with
// back-off, and the restart-loop rule. No I/O: unit-tested on its own.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

namespace ballast::runner {

struct Action {
  uint64_t id = 0;
  std::string name;     // restart, evict, replace, rollback, checkpoint_now, pause, escalate
  std::string subject;  // "rank:N", a node (slot) name, or "" for the job
  std::string reason;
  std::string args;  // JSON object text, "" for none
  std::string policy;
  std::string cause;  // the topic of the event behind it, or "executor"
  int64_t received_ns = 0;
  int tries = 0;  // failed tries so far
  int64_t not_before_ns = 0;
};

// Whether an action stops and starts the job's ranks again.
bool restarts_job(const std::string& action);
bool known_action(const std::string& action);

struct RetryPolicy {
  int max_tries = 3;     // a failing action is tried this many times, then escalated
  double backoff_s = 1;  // before the 2nd try; doubled for each further one
};

class ActionQueue {
 public:
  explicit ActionQueue(RetryPolicy retry = {}) : retry_(retry) {}
  // Queue an action. A job-restarting action while another one waits in the
  // queue is merged into it (one restart serves both): returns false then,
  // with the id it was merged into in *merged_into.
  bool push(Action a, uint64_t* merged_into);
  // Queue an action to run next (an evict's implied replace).
  void push_front(Action a) { queue_.push_front(std::move(a)); }
  // The next action due at now_ns, taken off the queue; nullopt if none is.
  std::optional<Action> pop_due(int64_t now_ns);
  // A try of `a` failed at now_ns: queued again at the front after its
  // back-off and true, or false when it has had all its tries.
  bool retry(Action a, int64_t now_ns);
  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }
  const Action* front() const { return queue_.empty() ? nullptr : &queue_.front(); }
  void clear() { queue_.clear(); }

 private:
  RetryPolicy retry_;
  std::deque<Action> queue_;
};

// The restart loop: the same fault (kind and subject) coming back after a
// restart, with training never getting past the step where it last struck.
// The (limit+1)-th such fault in a row is a loop: escalate, do not restart.
class RestartLoop {
 public:
  explicit RestartLoop(int limit) : limit_(limit) {}
  // A fault struck at high-water step `step`; returns how many times in a
  // row it has now struck without progress (1 = first time).
  int note(const std::string& signature, int64_t step);
  bool looping() const { return count_ > limit_; }
  int count() const { return count_; }
  int limit() const { return limit_; }

 private:
  int limit_;
  std::string signature_;
  int64_t step_ = -1;
  int count_ = 0;
};

}  // namespace ballast::runner
