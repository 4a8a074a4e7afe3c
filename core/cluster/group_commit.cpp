#include "group_commit.hpp"

#include "error.hpp"

#include <algorithm>
#include <chrono>

namespace ballast::cluster {

void GroupCommit::start() {
  thread_ = std::thread([this] { run(); });
}

void GroupCommit::stop() {
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  for (Ticket* t : waiting_) {
    t->done = true;
    t->rc = BALLAST_ESTATE;
    t->error = "the controller is stopping";
  }
  waiting_.clear();
  pending_.clear();
  forget_.clear();
  done_.notify_all();
}

int GroupCommit::commit(const std::map<std::string, uint64_t>& cursors) {
  std::vector<Ticket> tickets(cursors.size());
  std::unique_lock lock(mutex_);
  if (quit_) return fail(BALLAST_ESTATE, "the controller is stopping");
  size_t i = 0;
  for (const auto& [node, seq] : cursors) {
    uint64_t& cursor = pending_[node];
    cursor = std::max(cursor, seq);
    tickets[i].node = node;
    tickets[i].seq = seq;
    waiting_.push_back(&tickets[i++]);
  }
  work_.notify_one();
  done_.wait(lock, [&] {
    for (const Ticket& t : tickets)
      if (!t.done) return false;
    return true;
  });
  for (const Ticket& t : tickets)
    if (t.rc != BALLAST_OK) return fail(t.rc, t.error);
  return BALLAST_OK;
}

void GroupCommit::forget(const std::vector<uint64_t>& ids) {
  if (ids.empty()) return;
  {
    std::lock_guard lock(mutex_);
    if (quit_) return;
    forget_.insert(forget_.end(), ids.begin(), ids.end());
  }
  work_.notify_one();
}

uint64_t GroupCommit::forgotten() const {
  std::lock_guard lock(mutex_);
  return forgotten_;
}

uint64_t GroupCommit::transactions() const {
  std::lock_guard lock(mutex_);
  return transactions_;
}

void GroupCommit::run() {
  std::unique_lock lock(mutex_);
  std::map<std::string, uint64_t> group;
  std::vector<uint64_t> ids;
  while (!quit_) {
    work_.wait(lock, [&] { return quit_ || !pending_.empty() || !forget_.empty(); });
    if (quit_) break;
    group.clear();
    while (!pending_.empty() && group.size() < Leadership::kMaxOpsPerCommit) {
      group.insert(pending_.extract(pending_.begin()));
    }
    // The acknowledgements fill what room the cursors leave.
    const size_t room = std::min(forget_.size(), Leadership::kMaxOpsPerCommit - group.size());
    ids.assign(forget_.begin(), forget_.begin() + long(room));
    forget_.erase(forget_.begin(), forget_.begin() + long(room));
    lock.unlock();
    int rc = leadership_.commit(group, ids);
    std::string error = rc == BALLAST_OK ? "" : last_error();
    const bool again = rc != BALLAST_OK && !ids.empty() && leadership_.is_leader();
    lock.lock();
    ++transactions_;
    if (rc == BALLAST_OK) forgotten_ += ids.size();
    if (again) {
      forget_.insert(forget_.end(), ids.begin(), ids.end());
      // etcd failing at once (refused connections): not a busy loop.
      if (group.empty()) work_.wait_for(lock, std::chrono::milliseconds(200), [&] { return quit_; });
    }
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      Ticket* t = *it;
      auto g = group.find(t->node);
      if (g == group.end() || g->second < t->seq) {
        ++it;
        continue;
      }
      t->done = true;
      t->rc = rc;
      t->error = error;
      it = waiting_.erase(it);
    }
    done_.notify_all();
  }
}

}  // namespace ballast::cluster
