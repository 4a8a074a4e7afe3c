#include "spool.hpp"

#include "error.hpp"
#include "wire.hpp"

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace ballast::cluster {

namespace {

std::string segment_path(const std::string& dir, uint64_t first) {
  char name[48];
  std::snprintf(name, sizeof name, "seg-%020" PRIu64 ".journal", first);
  return (fs::path(dir) / name).string();
}

}  // namespace

int Spool::open(const SpoolOptions& options, const std::string& node, std::unique_ptr<Spool>* out) {
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) return fail(BALLAST_EIO, "cluster.spool.dir " + options.dir + ": " + ec.message());
  auto s = std::unique_ptr<Spool>(new Spool);
  s->options_ = options;
  s->node_ = node;
  {
    std::ifstream cursor(fs::path(options.dir) / "acked");
    uint64_t v = 0;
    if (cursor >> v) s->acked_ = v;
  }
  for (const auto& entry : fs::directory_iterator(options.dir, ec)) {
    std::string name = entry.path().filename().string();
    uint64_t first = 0;
    if (std::sscanf(name.c_str(), "seg-%20" SCNu64 ".journal", &first) != 1) continue;
    s->segments_[first] = entry.file_size(ec);
    s->bytes_ += s->segments_[first];
  }
  // The sequence continues after the last event of the last segment.
  s->next_seq_ = s->acked_ + 1;
  if (!s->segments_.empty()) {
    auto last = s->segments_.rbegin();
    uint64_t highest = last->first - 1;
    int rc = read_journal(
        segment_path(options.dir, last->first), JournalMode::skip_bad,
        [&](const OwnedEvent& ev, uint64_t) {
          Spooled sp;
          if (unwrap_spooled(ev.view(), &sp) && sp.seq > highest) highest = sp.seq;
        },
        [&](const JournalProblem&) {});
    if (rc != BALLAST_OK) return fail(rc, "cluster spool " + options.dir + ": " + last_error());
    s->next_seq_ = std::max(s->next_seq_, highest + 1);
  }
  if (int rc = s->roll(s->next_seq_); rc != BALLAST_OK) return rc;
  *out = std::move(s);
  return BALLAST_OK;
}

int Spool::roll(uint64_t first_seq) {
  writer_.close();
  std::string path = segment_path(options_.dir, first_seq);
  if (int rc = writer_.open(path); rc != BALLAST_OK) return rc;
  writer_first_ = first_seq;
  segments_.try_emplace(first_seq, 0);
  return BALLAST_OK;
}

int Spool::append(const unsigned char* frame, size_t size, uint64_t* seq) {
  std::lock_guard lock(mutex_);
  uint64_t record = size + 8 + 64;  // the wrapper's frame: header, seq, topic, node
  if (bytes_ + record > options_.max_bytes) {
    ++overflow_;
    return BALLAST_EFULL;
  }
  if (segments_[writer_first_] >= options_.segment_bytes && writer_first_ != next_seq_) {
    if (int rc = roll(next_seq_); rc != BALLAST_OK) return rc;
  }
  ballast_event ev = wrap_spooled(node_.c_str(), next_seq_, frame, size, &scratch_);
  if (int rc = writer_.append(ev); rc != BALLAST_OK) return rc;
  if (options_.durable) writer_.flush(true);
  segments_[writer_first_] += record;
  bytes_ += record;
  *seq = next_seq_++;
  return BALLAST_OK;
}

void Spool::acknowledge(uint64_t seq) {
  std::lock_guard lock(mutex_);
  if (seq <= acked_) return;
  acked_ = std::min(seq, next_seq_ - 1);
  // A segment is done when the next one starts at or below acked_ + 1.
  for (auto it = segments_.begin(); it != segments_.end();) {
    auto next = std::next(it);
    if (next == segments_.end() || next->first > acked_ + 1 || it->first == writer_first_) break;
    std::error_code ec;
    fs::remove(segment_path(options_.dir, it->first), ec);
    bytes_ -= std::min(bytes_, it->second);
    it = segments_.erase(it);
  }
  // The open segment, once fully acknowledged, starts over.
  if (segments_.size() == 1 && acked_ + 1 == next_seq_ && segments_[writer_first_] > options_.segment_bytes / 2) {
    uint64_t old = writer_first_, old_bytes = segments_[old];
    if (roll(next_seq_) == BALLAST_OK) {
      std::error_code ec;
      fs::remove(segment_path(options_.dir, old), ec);
      segments_.erase(old);
      bytes_ -= std::min(bytes_, old_bytes);
    }
  }
  persist_cursor();
}

void Spool::skip_to(uint64_t seq) {
  std::lock_guard lock(mutex_);
  if (seq < next_seq_) return;
  next_seq_ = seq + 1;
  acked_ = seq;
  roll(next_seq_);
  persist_cursor();
}

void Spool::persist_cursor() {
  // Written whole then renamed: a crash leaves the old or the new cursor.
  // A stale cursor only makes the agent resend what the controller dedups.
  fs::path tmp = fs::path(options_.dir) / "acked.tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return;
  std::fprintf(f, "%" PRIu64 "\n", acked_);
  std::fclose(f);
  std::error_code ec;
  fs::rename(tmp, fs::path(options_.dir) / "acked", ec);
}

int Spool::read(uint64_t first, uint64_t last,
                const std::function<bool(uint64_t, const std::vector<unsigned char>&)>& fn) {
  std::vector<uint64_t> starts;
  {
    std::lock_guard lock(mutex_);
    for (auto it = segments_.begin(); it != segments_.end(); ++it) {
      auto next = std::next(it);
      if (next != segments_.end() && next->first <= first) continue;
      if (it->first > last) break;
      starts.push_back(it->first);
    }
  }
  bool go = true;
  for (uint64_t start : starts) {
    if (!go) break;
    int rc = read_journal(
        segment_path(options_.dir, start), JournalMode::skip_bad,
        [&](const OwnedEvent& ev, uint64_t) {
          Spooled sp;
          if (!go || !unwrap_spooled(ev.view(), &sp) || sp.seq < first || sp.seq > last) return;
          go = fn(sp.seq, sp.frame);
        },
        [&](const JournalProblem&) {});
    if (rc != BALLAST_OK && rc != BALLAST_ENOTFOUND) return rc;
  }
  return BALLAST_OK;
}

uint64_t Spool::last_seq() const {
  std::lock_guard lock(mutex_);
  return next_seq_ - 1;
}
uint64_t Spool::acked() const {
  std::lock_guard lock(mutex_);
  return acked_;
}
uint64_t Spool::overflow() const {
  std::lock_guard lock(mutex_);
  return overflow_;
}
uint64_t Spool::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace ballast::cluster
