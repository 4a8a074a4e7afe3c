#include "group_commit.hpp"

#include "error.hpp"

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

uint64_t GroupCommit::transactions() const {
  std::lock_guard lock(mutex_);
  return transactions_;
}

void GroupCommit::run() {
  std::unique_lock lock(mutex_);
  std::map<std::string, uint64_t> group;
  while (!quit_) {
    work_.wait(lock, [&] { return quit_ || !pending_.empty(); });
    if (quit_) break;
    group.clear();
    while (!pending_.empty() && group.size() < Leadership::kMaxCursorsPerCommit) {
      group.insert(pending_.extract(pending_.begin()));
    }
    lock.unlock();
    int rc = leadership_.commit_cursors(group);
    std::string error = rc == BALLAST_OK ? "" : last_error();
    lock.lock();
    ++transactions_;
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
