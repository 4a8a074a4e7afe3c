#include "journal.hpp"

#include "codec_flat.hpp"
#include "error.hpp"

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace ballast {

// ---- writer -------------------------------------------------------------------

constexpr size_t kGroupLimit = 8u << 20;      // bytes handed over and not yet written, at most
constexpr size_t kWriteInPlace = 256u << 10;  // an appender finding this much waiting writes it itself

struct JournalWriter::Impl {
  int fd = -1;
  std::string path;
  Mode mode = Mode::direct;
  std::mutex mu;  // direct: one write at a time; grouped: the fields below
  // grouped only
  std::condition_variable work, written;
  std::vector<unsigned char> pending;  // handed over, not yet written
  std::vector<unsigned char> spare;    // the bytes being written (its capacity kept for the next write)
  uint64_t handed = 0, done = 0;       // bytes handed over / written, in all
  bool writing = false;                // a thread is writing `spare`: one write at a time keeps the order
  bool writer_idle = false;            // the writer thread waits on `work`
  bool quit = false;
  int status = BALLAST_OK;  // the first failed write, returned by every later call
  std::string message;
  std::thread writer;
};

JournalWriter::~JournalWriter() { close(); }

int JournalWriter::open(const std::string& path, Mode mode) {
  close();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return fail(BALLAST_EIO, path + ": cannot open for appending: " + std::strerror(errno));
  impl_ = new Impl;
  impl_->fd = fd;
  impl_->path = path;
  impl_->mode = mode;
  if (mode == Mode::grouped) impl_->writer = std::thread([this] { writer_loop(); });
  return BALLAST_OK;
}

// O_APPEND: each write lands at the end of the file. A regular file takes
// the bytes in one write; the loop only finishes a short write (disk full).
// Bytes that cannot be written whole are cut off again, so that the file
// ends with whole frames (the failure is the caller's to count).
int JournalWriter::write_all(const unsigned char* data, size_t size) {
  const off_t end = ::lseek(impl_->fd, 0, SEEK_END);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(impl_->fd, data + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      if (done > 0 && end >= 0 && ::ftruncate(impl_->fd, end) != 0) {
        return fail(BALLAST_EIO, impl_->path + ": write failed: " + std::strerror(err) +
                                     "; a partial frame is left at byte " + std::to_string(end));
      }
      return fail(BALLAST_EIO, impl_->path + ": write failed: " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  return BALLAST_OK;
}

// Grouped: write everything handed over so far in one write, the lock
// released meanwhile. Called with the lock held, no write running and
// something pending.
void JournalWriter::write_pending(std::unique_lock<std::mutex>& lock) {
  impl_->writing = true;
  impl_->spare.swap(impl_->pending);
  const int before = impl_->status;
  lock.unlock();
  const int rc = before == BALLAST_OK ? write_all(impl_->spare.data(), impl_->spare.size()) : before;
  const std::string why = rc == BALLAST_OK ? "" : last_error();
  lock.lock();
  if (rc != BALLAST_OK && impl_->status == BALLAST_OK) {
    impl_->status = rc;
    impl_->message = why;
  }
  impl_->done += impl_->spare.size();
  impl_->spare.clear();
  impl_->writing = false;
  impl_->written.notify_all();
  if (impl_->writer_idle) impl_->work.notify_one();  // what was handed over meanwhile, or quit
}

// The writer thread writes what appenders leave behind; under load the
// appenders write most of it themselves (hand_over), so that a writer
// thread that gets a small share of the CPU (one thread among many busy
// ones) does not hold everyone back.
void JournalWriter::writer_loop() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  for (;;) {
    if (!impl_->pending.empty() && !impl_->writing) {
      write_pending(lock);
      continue;
    }
    if (impl_->quit && impl_->pending.empty() && !impl_->writing) return;
    impl_->writer_idle = true;
    impl_->work.wait(lock);
    impl_->writer_idle = false;
  }
}

int JournalWriter::append(const ballast_event& event) { return append_batch(&event, 1); }

int JournalWriter::append_batch(const ballast_event* events, size_t count) {
  if (impl_ == nullptr) return fail(BALLAST_ESTATE, "journal: append before open");
  thread_local std::vector<unsigned char> frames;
  frames.clear();
  for (size_t i = 0; i < count; ++i) {
    const char* why = nullptr;
    if (!codec::check_event(events[i], &why)) return fail(BALLAST_EINVAL, impl_->path + ": event not written: " + why);
    const size_t start = frames.size();
    encode_frame(events[i], &frames);
    if (frames.size() - start - kFrameHeaderSize > kMaxFrameBody)
      return fail(BALLAST_EINVAL, impl_->path + ": event of " + std::to_string(frames.size() - start) +
                                      " bytes is above the frame limit");
  }
  return hand_over(frames.data(), frames.size());
}

int JournalWriter::append_frames(const unsigned char* frames, size_t size) {
  if (impl_ == nullptr) return fail(BALLAST_ESTATE, "journal: append before open");
  return hand_over(frames, size);
}

int JournalWriter::hand_over(const unsigned char* frames, size_t size) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  if (impl_->mode == Mode::direct) return write_all(frames, size);
  impl_->written.wait(lock, [&] { return impl_->handed - impl_->done < kGroupLimit || impl_->status != BALLAST_OK; });
  if (impl_->status != BALLAST_OK) return fail(impl_->status, impl_->message);
  impl_->pending.insert(impl_->pending.end(), frames, frames + size);
  impl_->handed += size;
  if (!impl_->writing && impl_->pending.size() >= kWriteInPlace) {
    write_pending(lock);  // a failure is the writer's status, returned by the later calls
  } else if (impl_->writer_idle) {
    impl_->writer_idle = false;  // one wake-up, not one per append until it runs
    impl_->work.notify_one();
  }
  return BALLAST_OK;
}

int JournalWriter::flush(bool durable) {
  if (impl_ == nullptr) return fail(BALLAST_ESTATE, "journal: flush before open");
  if (impl_->mode == Mode::grouped) {
    std::unique_lock<std::mutex> lock(impl_->mu);
    const uint64_t upto = impl_->handed;
    if (!impl_->writing && !impl_->pending.empty()) write_pending(lock);
    impl_->written.wait(lock, [&] { return impl_->done >= upto; });
    if (impl_->status != BALLAST_OK) return fail(impl_->status, impl_->message);
  }
  // Frames go straight to the OS (no user-space buffer): only durability is left.
  if (durable && ::fdatasync(impl_->fd) != 0)
    return fail(BALLAST_EIO, impl_->path + ": fdatasync failed: " + std::strerror(errno));
  return BALLAST_OK;
}

void JournalWriter::close() {
  if (impl_ == nullptr) return;
  if (impl_->writer.joinable()) {
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->quit = true;
    }
    impl_->work.notify_one();
    impl_->writer.join();
  }
  ::close(impl_->fd);
  delete impl_;
  impl_ = nullptr;
}

// ---- reader -------------------------------------------------------------------

namespace {

// A window over the file, refilled as frames are consumed, so that a large
// journal is read without holding it in memory (at most one frame plus a
// read chunk).
class Window {
 public:
  explicit Window(int fd) : fd_(fd) {}

  // Make at least `n` bytes available from pos() (fewer at the end of the file).
  int want(size_t n) {
    if (avail() >= n || eof_) return BALLAST_OK;
    if (pos_ > 0) {
      buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
      base_ += pos_;
      pos_ = 0;
    }
    while (buf_.size() < n && !eof_) {
      const size_t have = buf_.size();
      const size_t chunk = std::max<size_t>(n - have, 1 << 20);
      buf_.resize(have + chunk);
      const ssize_t r = ::read(fd_, buf_.data() + have, chunk);
      if (r < 0 && errno == EINTR) {
        buf_.resize(have);
        continue;
      }
      if (r < 0) {
        buf_.resize(have);
        return BALLAST_EIO;
      }
      buf_.resize(have + static_cast<size_t>(r));
      if (r == 0) eof_ = true;
    }
    return BALLAST_OK;
  }
  const unsigned char* data() const { return buf_.data() + pos_; }
  size_t avail() const { return buf_.size() - pos_; }
  uint64_t offset() const { return base_ + pos_; }
  void skip(size_t n) { pos_ += n; }
  bool at_end() const { return eof_ && avail() == 0; }

 private:
  int fd_;
  std::vector<unsigned char> buf_;
  size_t pos_ = 0;
  uint64_t base_ = 0;  // file offset of buf_[0]
  bool eof_ = false;
};

constexpr unsigned char kMagic[4] = {'B', 'L', 'F', '1'};

// Move to the next frame magic after the current position (or to the end).
int resync(Window& w) {
  w.skip(1);
  for (;;) {
    if (int rc = w.want(4 << 10); rc != BALLAST_OK) return rc;
    const unsigned char* p = w.data();
    const size_t n = w.avail();
    if (n < 4) {
      w.skip(n);
      return BALLAST_OK;
    }
    const void* hit = memmem(p, n, kMagic, 4);
    if (hit != nullptr) {
      w.skip(static_cast<size_t>(static_cast<const unsigned char*>(hit) - p));
      return BALLAST_OK;
    }
    w.skip(n - 3);  // a magic may straddle the window's end
  }
}

}  // namespace

int read_journal(const std::string& path, JournalMode mode,
                 const std::function<void(const OwnedEvent&, uint64_t offset)>& on_event,
                 const std::function<void(const JournalProblem&)>& on_problem) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return fail(err == ENOENT ? BALLAST_ENOTFOUND : BALLAST_EIO, path + ": cannot open: " + std::strerror(err));
  }
  Window w(fd);
  int status = BALLAST_OK;
  OwnedEvent event;
  std::string reason;
  for (;;) {
    if (w.want(kFrameHeaderSize) != BALLAST_OK) {
      status =
          fail(BALLAST_EIO, path + ": read failed at byte " + std::to_string(w.offset()) + ": " + std::strerror(errno));
      break;
    }
    if (w.at_end()) break;
    // Read the whole frame the header announces (bounded by kMaxFrameBody).
    if (w.avail() >= kFrameHeaderSize) {
      uint32_t length = 0;
      std::memcpy(&length, w.data() + 8, 4);  // little endian, as written
      if (std::memcmp(w.data(), kMagic, 4) == 0 && length <= kMaxFrameBody &&
          w.want(kFrameHeaderSize + length) != BALLAST_OK) {
        status = fail(BALLAST_EIO,
                      path + ": read failed at byte " + std::to_string(w.offset()) + ": " + std::strerror(errno));
        break;
      }
    }
    size_t consumed = 0;
    const uint64_t offset = w.offset();
    if (decode_frame(w.data(), w.avail(), &event, &consumed, &reason) == BALLAST_OK) {
      if (on_event) on_event(event, offset);
      w.skip(consumed);
      continue;
    }
    if (on_problem) on_problem(JournalProblem{offset, reason});
    if (mode == JournalMode::refuse_bad) {
      status = fail(BALLAST_EFORMAT, path + ": byte " + std::to_string(offset) + ": " + reason);
      break;
    }
    if (resync(w) != BALLAST_OK) {
      status = fail(BALLAST_EIO, path + ": read failed: " + std::strerror(errno));
      break;
    }
  }
  ::close(fd);
  return status;
}

}  // namespace ballast
