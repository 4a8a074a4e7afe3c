#include "bus.hpp"

#include "bus_rcu.hpp"
#include "bus_ring.hpp"
#include "codec_flat.hpp"
#include "error.hpp"
#include "topic.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

// How the bus is built (the guarantees are in bus.hpp):
// - Publishers take no lock: they read the topic table and the topic's list
//   of matching subscriptions inside an rcu section (bus_rcu.hpp).
//   Subscribe/unsubscribe build new lists under `mu`, swap them in, and
//   retire the old ones, which are freed after a grace period.
// - Each topic caches the list of subscriptions that match it, so that a
//   publish is a hash lookup and a loop.
// - Queued subscriptions each own a Ring (bus_ring.hpp) and are served by
//   one dispatcher thread, fixed at subscribe time, so a subscription's
//   handler never runs twice at once and sees each publisher's events in
//   order.
// - Counters that every publish touches are per thread (single writer, no
//   atomic read-modify-write on a shared line) and summed by stats().

namespace ballast {

namespace {

constexpr size_t kBatch = 256;  // events a dispatcher takes from one queue in a row
constexpr size_t kMaxTopics = 1 << 16;
constexpr uint32_t kMaxQueueCapacity = 1u << 20;
constexpr unsigned kMaxDispatchers = 64;

struct Dispatcher;

struct Sub {
  uint64_t id = 0;
  std::string pattern;
  std::string owner;
  ballast_handler handler = nullptr;
  void* user = nullptr;
  bool queued = false;
  bool lossy = false;
  std::atomic<bool> alive{true};
  std::atomic<uint64_t> dropped{0};
  // Queued only.
  std::unique_ptr<Ring> ring;
  Dispatcher* dispatcher = nullptr;
  // Written by its dispatcher at every drain: on a line of its own, away
  // from what every publish reads (alive, ring).
  alignas(64) std::atomic<bool> busy{false};  // its dispatcher is inside drain() for it
  std::atomic<uint32_t> space_epoch{0};       // bumped when room is made for waiting publishers
  std::atomic<uint32_t> space_waiters{0};
};

struct Retired {
  virtual ~Retired() = default;
};

struct Entry {
  Sub* sub;
  ballast_handler handler;
  void* user;
  bool queued;
};

struct SubList final : Retired {
  std::vector<Entry> entries;
  std::vector<std::shared_ptr<Sub>> owners;  // keeps the subscriptions alive while listed
  uint32_t queued = 0;
};

struct Topic {
  std::string name;
  uint64_t hash = 0;
  std::atomic<const SubList*> subs{nullptr};
};

struct TopicTable final : Retired {
  uint64_t mask = 0;
  std::vector<Topic*> slots;
};

struct alignas(64) ThreadCounters {
  std::atomic<uint64_t> published{0};
  std::atomic<uint64_t> delivered{0};
  std::atomic<uint64_t> failures{0};
};

// Add to a counter that only this thread writes.
inline void bump(std::atomic<uint64_t>& c, uint64_t n) {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// A handler must not throw (event.h); if one does anyway, it counts as a
// failure instead of unwinding through the bus.
inline int call(ballast_handler h, void* user, const ballast_event& ev) noexcept {
  try {
    return h(user, &ev);
  } catch (...) {
    return -1;
  }
}

inline void pause() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The dispatcher sleeps on a futex of its wake word, not through
// std::atomic::wait, whose own spin (ending in sched_yield calls) would
// follow the dispatcher's spin_for_work. futex_wait returns at once when the
// word is no longer `seen`, and may return spuriously.
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free);
inline void futex_wait(std::atomic<uint32_t>& word, uint32_t seen) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}
inline void futex_wake_one(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}
inline void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

// Publishers blocked on a full queue sleep on its space_epoch (a futex, not
// std::atomic::wait, whose spin of sched_yield calls took the CPU from the
// dispatcher they wait for: with many blocked publishers the queue stayed
// full). Bump the epoch, then wake them all.
inline void wake_space_waiters(Sub& s) {
  s.space_epoch.fetch_add(1, std::memory_order_release);
  futex_wake_all(s.space_epoch);
}

inline uint64_t load8(const char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

// Topic names are short: hash and compare them 8 bytes at a time, the last
// (partial) word read as the 8 bytes ending at the name's end, so that no
// byte past the name is read and no variable-size copy is made.
uint64_t hash_topic(const char* s, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  if (n < 8) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 0x100000001b3ull;
  } else {
    size_t i = 0;
    for (; i + 8 < n; i += 8) {
      h = (h ^ load8(s + i)) * 0xff51afd7ed558ccdull;
      h ^= h >> 32;
    }
    h = (h ^ load8(s + n - 8)) * 0xc4ceb9fe1a85ec53ull;
  }
  return h ^ (h >> 29);
}

inline bool same_name(const char* a, const char* b, size_t n) {
  if (n < 8) return std::memcmp(a, b, n) == 0;
  for (size_t i = 0; i + 8 < n; i += 8)
    if (load8(a + i) != load8(b + i)) return false;
  return load8(a + n - 8) == load8(b + n - 8);
}

struct Dispatcher {
  const void* bus = nullptr;  // the owning Bus::Impl
  std::thread thread;
  std::mutex mu;
  std::vector<std::shared_ptr<Sub>> subs;  // under mu
  std::atomic<uint64_t> version{0};        // bumped under mu when subs changes
  size_t load = 0;                         // under the bus's mu
  std::atomic<bool> sleeping{false};
  std::atomic<uint32_t> wake_seq{0};
  std::atomic<bool> stopping{false};
  // Written after every drain: on a line of their own, away from
  // `sleeping`, which every publish reads.
  alignas(64) std::atomic<uint64_t> delivered{0};  // written by this dispatcher's thread only
  std::atomic<uint64_t> failures{0};
  // This dispatcher's thread only.
  std::vector<std::shared_ptr<Sub>> local;
  uint64_t local_version = ~0ull;
  unsigned depth = 0;  // drains on the stack
  // Shared by the bus's dispatchers, for the end of shutdown.
  std::atomic<uint64_t>* passes = nullptr;  // drain passes that delivered something
  std::atomic<bool>* drained = nullptr;     // a dispatcher found the bus quiet: all stop
  std::atomic<int>* active = nullptr;       // dispatchers inside a pass
  std::function<bool()> quiescent;          // no pass running and every queue empty

  void wake() {
    wake_seq.fetch_add(1, std::memory_order_release);
    futex_wake_one(wake_seq);
  }
  // From publish(): only the first publisher that finds the dispatcher
  // asleep pays for the futex call, not every one until it has woken up.
  void wake_sleeper() {
    if (sleeping.exchange(false, std::memory_order_acq_rel)) wake();
  }

  // Deliver up to `max` queued events of `s` (served by this dispatcher).
  size_t drain(Sub& s, size_t max) {
    if (s.busy.load(std::memory_order_relaxed)) return 0;  // already on this thread's stack
    s.busy.store(true, std::memory_order_seq_cst);
    size_t n = 0;
    if (s.alive.load(std::memory_order_seq_cst)) {
      ++depth;
      uint64_t ok = 0, bad = 0;
      while (n < max && s.alive.load(std::memory_order_relaxed)) {
        Ring::Slot* slot = s.ring->front();
        if (slot == nullptr) break;
        if (slot->event.topic != nullptr) {
          ++ok;
          if (call(s.handler, s.user, slot->event) < 0) ++bad;
        } else {
          s.dropped.fetch_add(1, std::memory_order_relaxed);  // the copy could not be made
        }
        s.ring->pop();
        ++n;
      }
      bump(delivered, ok);
      bump(failures, bad);
      --depth;
    }
    s.busy.store(false, std::memory_order_release);
    if (n > 0) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      // Blocked publishers are woken once the queue is half empty, so that
      // each wake-up finds room for many events, not one wake per drain. A
      // queue above half still holds events: this dispatcher drains it again.
      if (s.space_waiters.load(std::memory_order_relaxed) > 0 && s.ring->size() <= s.ring->capacity() / 2)
        wake_space_waiters(s);
    }
    return n;
  }

  // While this thread waits (a handler blocked on a full queue or in
  // unsubscribe), keep its other queues moving.
  bool help() {
    bool any = false;
    for (size_t i = 0; i < local.size(); ++i) any |= drain(*local[i], kBatch) > 0;
    return any;
  }

  void refresh() {
    if (version.load(std::memory_order_acquire) == local_version) return;
    std::lock_guard<std::mutex> lock(mu);
    local = subs;
    local_version = version.load(std::memory_order_relaxed);
  }

  bool has_work() {
    for (auto& s : local)
      if (s->alive.load(std::memory_order_relaxed) && s->ring->front() != nullptr) return true;
    return false;
  }

  // Whether work showed up within kSpin of polling. Bounded by time, not
  // by a count of pause instructions: a pause takes from a few cycles to
  // over a hundred depending on the processor (4096 take 115 us on the dev
  // VM's AMD EPYC), and every microsecond polled is taken from publishers
  // that may share the core.
  static constexpr auto kSpin = std::chrono::microseconds(50);
  bool spin_for_work() {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (unsigned i = 1;; ++i) {
      if ((i & 63) == 0) {
        if (has_work() || version.load(std::memory_order_relaxed) != local_version ||
            stopping.load(std::memory_order_relaxed))
          return true;
        if (std::chrono::steady_clock::now() >= until) return false;
      }
      pause();
    }
  }

  void run();
};

thread_local Dispatcher* t_dispatcher = nullptr;

void Dispatcher::run() {
  t_dispatcher = this;
  unsigned round = 0;
  for (;;) {
    refresh();
    bool progress = false;
    active->fetch_add(1, std::memory_order_seq_cst);
    for (auto& s : local) progress |= drain(*s, kBatch) > 0;
    if (progress) passes->fetch_add(1, std::memory_order_seq_cst);
    active->fetch_sub(1, std::memory_order_seq_cst);
    if (progress) continue;
    if (stopping.load(std::memory_order_acquire)) {
      // Outside publishers are done (shutdown waited for them), but
      // handlers may still publish into any dispatcher's queues: stop when
      // the whole bus is quiet.
      if (drained->load(std::memory_order_acquire) || quiescent()) {
        drained->store(true, std::memory_order_release);
        break;
      }
      rcu::backoff(round);
      continue;
    }
    // Poll a little before sleeping: a publisher then finds us awake and
    // need not pay a futex wake per event when events come one by one.
    if (spin_for_work()) continue;
    const uint32_t seen = wake_seq.load(std::memory_order_acquire);
    sleeping.store(true, std::memory_order_relaxed);
    rcu::full_barrier();  // pairs with publish()'s light_barrier()
    const bool ready = version.load(std::memory_order_relaxed) != local_version ||
                       stopping.load(std::memory_order_relaxed) || has_work();
    if (!ready)
      while (wake_seq.load(std::memory_order_acquire) == seen) futex_wait(wake_seq, seen);
    sleeping.store(false, std::memory_order_relaxed);
  }
  local.clear();
  t_dispatcher = nullptr;
}

bool help_if_dispatcher() { return t_dispatcher != nullptr && t_dispatcher->help(); }

}  // namespace

struct Bus::Impl {
  BusOptions options;
  std::mutex mu;  // subscriptions, topics, retired lists; never held while waiting
  std::map<uint64_t, std::shared_ptr<Sub>> subs;
  uint64_t next_id = 1;
  std::vector<std::unique_ptr<Topic>> topics;
  std::atomic<const TopicTable*> table{nullptr};
  std::vector<std::unique_ptr<Retired>> retired;
  std::vector<std::unique_ptr<Dispatcher>> dispatchers;
  std::unique_ptr<ThreadCounters[]> counters{new ThreadCounters[rcu::kMaxThreads]};
  std::atomic<bool> closed{false};
  std::atomic<uint64_t> retired_dropped{0};  // drops of removed subscriptions
  std::mutex join_mu;
  bool joined = false;
  // Written by the dispatchers at every pass: on a line of their own, away
  // from `closed` and `counters`, which every publish reads.
  alignas(64) std::atomic<uint64_t> passes{0};
  std::atomic<int> active{0};
  std::atomic<bool> drained{false};

  // Whether every queue is empty and no handler can publish any more: no
  // dispatcher pass delivered anything or was running while the queues
  // were checked (once outside publishers are refused, a queue only fills
  // from a handler).
  bool quiescent() {
    const uint64_t before = passes.load(std::memory_order_seq_cst);
    if (active.load(std::memory_order_seq_cst) != 0) return false;
    for (auto& d : dispatchers) {
      std::lock_guard<std::mutex> lock(d->mu);
      for (auto& s : d->subs)
        if (s->alive.load(std::memory_order_relaxed) && !s->ring->empty()) return false;
    }
    return active.load(std::memory_order_seq_cst) == 0 && passes.load(std::memory_order_seq_cst) == before;
  }

  ~Impl() {
    for (auto& t : topics) delete t->subs.load(std::memory_order_relaxed);
    delete table.load(std::memory_order_relaxed);
  }

  Topic* lookup(const char* name, size_t n, uint64_t h) const {
    const TopicTable* tb = table.load(std::memory_order_acquire);
    for (uint64_t i = h & tb->mask;; i = (i + 1) & tb->mask) {
      Topic* t = tb->slots[i];
      if (t == nullptr) return nullptr;
      if (t->hash == h && t->name.size() == n && same_name(t->name.data(), name, n)) return t;
    }
  }

  // A list of the subscriptions matching `topic`, in subscription order. mu held.
  std::unique_ptr<SubList> build_list(const std::string& topic) {
    auto list = std::make_unique<SubList>();
    for (auto& [id, s] : subs) {
      if (!pattern_matches(s->pattern, topic)) continue;
      list->entries.push_back(Entry{s.get(), s->handler, s->user, s->queued});
      list->owners.push_back(s);
      list->queued += s->queued ? 1 : 0;
    }
    return list;
  }

  // Rebuild the lists of the topics `pattern` matches. mu held.
  void relist(const std::string& pattern) {
    for (auto& t : topics) {
      if (!pattern_matches(pattern, t->name)) continue;
      auto fresh = build_list(t->name);
      const SubList* old = t->subs.exchange(fresh.release(), std::memory_order_acq_rel);
      if (old != nullptr) retired.emplace_back(const_cast<SubList*>(old));
    }
  }

  int intern(const char* name, size_t n, uint64_t h, Topic** out) {
    const std::string_view view(name, n);
    if (!valid_topic(view)) return fail(BALLAST_EINVAL, "bus: " + invalid_topic_message(view));
    std::lock_guard<std::mutex> lock(mu);
    if ((*out = lookup(name, n, h)) != nullptr) return BALLAST_OK;  // another thread was first
    if (topics.size() >= kMaxTopics)
      return fail(BALLAST_ENOMEM, "bus: more than " + std::to_string(kMaxTopics) + " topics");
    auto t = std::make_unique<Topic>();
    t->name.assign(view);
    t->hash = h;
    t->subs.store(build_list(t->name).release(), std::memory_order_relaxed);
    topics.push_back(std::move(t));
    // A new table each time (topics are few and interned once): readers of
    // the old one finish with it before it is freed.
    const TopicTable* old = table.load(std::memory_order_relaxed);
    auto fresh = std::make_unique<TopicTable>();
    uint64_t cap = old->mask + 1;
    while (cap < topics.size() * 2) cap *= 2;
    fresh->mask = cap - 1;
    fresh->slots.assign(cap, nullptr);
    for (auto& topic : topics) {
      uint64_t i = topic->hash & fresh->mask;
      while (fresh->slots[i] != nullptr) i = (i + 1) & fresh->mask;
      fresh->slots[i] = topic.get();
    }
    table.store(fresh.release(), std::memory_order_release);
    retired.emplace_back(const_cast<TopicTable*>(old));
    *out = topics.back().get();
    return BALLAST_OK;
  }

  // Free what was retired, after a grace period. Not from inside a section
  // (a handler): its own section may still use them; the next writer frees.
  void reclaim() {
    // From a handler (in a section, or on a dispatcher that publishers may be
    // blocked on) a grace period may skip parked threads: leave it to the
    // next writer outside, or to shutdown.
    if (rcu::in_section() || t_dispatcher != nullptr) return;
    std::vector<std::unique_ptr<Retired>> done;
    {
      std::lock_guard<std::mutex> lock(mu);
      done.swap(retired);
    }
    if (done.empty()) return;
    rcu::synchronize();
  }

  // Copy `ev` into `s`'s queue; blocks while a lossless queue is full.
  // `flat`/`flat_bytes`/`flat_ev` cache one flattened copy for several queues.
  // Copies point at the interned topic name (topics live as long as the
  // bus) instead of copying it.
  void enqueue(Sub& s, const ballast_event& ev, const Topic& topic, bool single, std::vector<uint64_t>& scratch,
               size_t& flat_bytes, ballast_event& flat_ev) {
    uint64_t pos = 0;
    Ring::Slot* slot = nullptr;
    unsigned round = 0;
    while ((slot = s.ring->claim(&pos)) == nullptr) {
      if (s.lossy || !s.alive.load(std::memory_order_relaxed)) {
        s.dropped.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      if (t_dispatcher == s.dispatcher) {
        // Its dispatcher is this thread: waiting would wait for ourselves.
        // Make room by delivering in place, unless that handler is on our
        // stack (a handler feeding its own full queue): then drop and count.
        if (s.busy.load(std::memory_order_relaxed)) {
          s.dropped.fetch_add(1, std::memory_order_relaxed);
          return;
        }
        if (t_dispatcher->drain(s, kBatch) == 0) rcu::backoff(round);
        continue;
      }
      if (t_dispatcher != nullptr) {
        if (!t_dispatcher->help()) rcu::backoff(round);
        continue;
      }
      // Sleep until the dispatcher makes room (or the subscription goes).
      const uint32_t epoch = s.space_epoch.load(std::memory_order_acquire);
      if (!s.alive.load(std::memory_order_acquire)) continue;
      s.space_waiters.fetch_add(1, std::memory_order_seq_cst);
      slot = s.ring->claim(&pos);
      if (slot == nullptr) {
        // Parked while blocked: no handler runs here, so writers in handlers
        // (whose dispatcher we may be waiting for) need not wait for us.
        rcu::park();
        futex_wait(s.space_epoch, epoch);
        rcu::unpark();
      }
      s.space_waiters.fetch_sub(1, std::memory_order_relaxed);
      if (slot != nullptr) break;
    }
    if (single) {
      size_t bytes = 0;
      const char* name = topic.name.c_str();
      if (!codec::flatten_into(ev, slot->inline_buf, Ring::kInline, &slot->event, &bytes, name)) {
        unsigned char* buf = Ring::buffer(*slot, bytes);
        if (buf != nullptr)
          codec::flatten(ev, buf, &slot->event, name);
        else
          slot->event.topic = nullptr;
      }
    } else {
      if (flat_bytes == 0) {
        flat_bytes = codec::flat_size(ev, topic.name.c_str());
        if (scratch.size() * 8 < flat_bytes) scratch.resize((flat_bytes + 7) / 8);
        codec::flatten(ev, reinterpret_cast<unsigned char*>(scratch.data()), &flat_ev, topic.name.c_str());
      }
      unsigned char* buf = Ring::buffer(*slot, flat_bytes);
      if (buf != nullptr)
        codec::copy_flat(flat_ev, reinterpret_cast<const unsigned char*>(scratch.data()), flat_bytes, buf,
                         &slot->event);
      else
        slot->event.topic = nullptr;
    }
    Ring::commit(*slot, pos);
  }
};

Bus::Bus(BusOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = options;
  m.options.dispatcher_threads = std::clamp(options.dispatcher_threads, 1u, kMaxDispatchers);
  if (m.options.default_queue_capacity == 0) m.options.default_queue_capacity = 4096;
  auto tb = std::make_unique<TopicTable>();
  tb->mask = 63;
  tb->slots.assign(64, nullptr);
  m.table.store(tb.release(), std::memory_order_release);
  for (unsigned i = 0; i < m.options.dispatcher_threads; ++i) {
    auto d = std::make_unique<Dispatcher>();
    d->bus = &m;
    d->passes = &m.passes;
    d->active = &m.active;
    d->drained = &m.drained;
    d->quiescent = [&m] { return m.quiescent(); };
    m.dispatchers.push_back(std::move(d));
  }
  for (auto& d : m.dispatchers) d->thread = std::thread([p = d.get()] { p->run(); });
}

Bus::~Bus() { shutdown(); }

int Bus::subscribe(std::string_view pattern, const ballast_subscribe_options* options, ballast_handler handler,
                   void* user, std::string_view owner, uint64_t* id) {
  Impl& m = *impl_;
  const std::string who = owner.empty() ? std::string("subscriber") : std::string(owner);
  if (id == nullptr) return fail(BALLAST_EINVAL, "bus: " + who + ": subscribe without an id to write");
  if (handler == nullptr) return fail(BALLAST_EINVAL, "bus: " + who + ": subscribe with a NULL handler");
  if (!valid_pattern(pattern)) return fail(BALLAST_EINVAL, "bus: " + who + ": " + invalid_pattern_message(pattern));
  bool queued = false, lossy = false;
  uint32_t capacity = m.options.default_queue_capacity;
  if (options != nullptr) {
    // The ABI's size rule: at least the v1 size; flags and queue_capacity
    // are read only when the size covers them (else 0).
    const uint32_t size = options->size;
    if (size < BALLAST_SUBSCRIBE_OPTIONS_V1_SIZE)
      return fail(BALLAST_EINVAL, "bus: " + who + ": subscribe options size " + std::to_string(size) +
                                      " is smaller than ballast_subscribe_options v1 (" +
                                      std::to_string(BALLAST_SUBSCRIBE_OPTIONS_V1_SIZE) + ")");
    const uint32_t flags = BALLAST_COVERS(size, ballast_subscribe_options, flags) ? options->flags : 0;
    const uint32_t queue_capacity =
        BALLAST_COVERS(size, ballast_subscribe_options, queue_capacity) ? options->queue_capacity : 0;
    if (options->delivery != BALLAST_DELIVER_INLINE && options->delivery != BALLAST_DELIVER_QUEUED)
      return fail(BALLAST_EINVAL, "bus: " + who + ": unknown delivery " + std::to_string(options->delivery));
    if ((flags & ~uint32_t{BALLAST_SUBSCRIBE_LOSSY}) != 0)
      return fail(BALLAST_EINVAL, "bus: " + who + ": unknown subscribe flags " + std::to_string(flags));
    if (queue_capacity > kMaxQueueCapacity)
      return fail(BALLAST_EINVAL, "bus: " + who + ": queue_capacity " + std::to_string(queue_capacity) + " is above " +
                                      std::to_string(kMaxQueueCapacity));
    queued = options->delivery == BALLAST_DELIVER_QUEUED;
    lossy = queued && (flags & BALLAST_SUBSCRIBE_LOSSY) != 0;
    if (queue_capacity != 0) capacity = queue_capacity;
  }
  if (m.closed.load(std::memory_order_acquire))
    return fail(BALLAST_ESTATE, "bus: " + who + ": subscribe after shutdown");

  auto s = std::make_shared<Sub>();
  s->pattern.assign(pattern);
  s->owner = who;
  s->handler = handler;
  s->user = user;
  s->queued = queued;
  s->lossy = lossy;
  if (queued) {
    try {
      s->ring = std::make_unique<Ring>(capacity);  // preallocated: no allocation per event
    } catch (const std::bad_alloc&) {
      return fail(BALLAST_ENOMEM, "bus: " + who + ": no memory for a queue of " + std::to_string(capacity));
    }
  }
  Dispatcher* d = nullptr;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    s->id = m.next_id++;
    if (queued) {
      d = std::min_element(m.dispatchers.begin(), m.dispatchers.end(), [](const auto& a, const auto& b) {
            return a->load < b->load;
          })->get();
      ++d->load;
      s->dispatcher = d;
      std::lock_guard<std::mutex> dlock(d->mu);
      d->subs.push_back(s);
      d->version.fetch_add(1, std::memory_order_release);
    }
    m.subs.emplace(s->id, s);
    m.relist(s->pattern);
  }
  if (d != nullptr) d->wake();
  *id = s->id;
  m.reclaim();
  return BALLAST_OK;
}

int Bus::unsubscribe(uint64_t id) {
  Impl& m = *impl_;
  std::shared_ptr<Sub> s;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.subs.find(id);
    if (it == m.subs.end()) return fail(BALLAST_ENOTFOUND, "bus: no subscription " + std::to_string(id));
    s = it->second;
    if (s->queued && t_dispatcher == s->dispatcher && s->busy.load(std::memory_order_relaxed))
      return fail(BALLAST_ESTATE, "bus: " + s->owner + ": subscription " + std::to_string(id) +
                                      " cannot be removed from its own handler");
    m.subs.erase(it);
    s->alive.store(false, std::memory_order_seq_cst);
    m.relist(s->pattern);
    if (s->queued) {
      --s->dispatcher->load;
      std::lock_guard<std::mutex> dlock(s->dispatcher->mu);
      auto& v = s->dispatcher->subs;
      v.erase(std::find(v.begin(), v.end(), s));
      s->dispatcher->version.fetch_add(1, std::memory_order_release);
    }
  }
  if (s->queued) {
    // Publishers blocked on its full queue give up (and count the drop).
    wake_space_waiters(*s);
    s->dispatcher->wake();
  }
  // No inline call of the handler is running or can start after this...
  rcu::synchronize(help_if_dispatcher, t_dispatcher != nullptr);
  if (s->queued) {
    // ...and its dispatcher is out of it.
    unsigned round = 0;
    while (s->busy.load(std::memory_order_seq_cst))
      if (!help_if_dispatcher()) rcu::backoff(round);
    // Nobody consumes this ring any more: what is left is discarded and counted.
    uint64_t left = 0;
    while (s->ring->front() != nullptr) {
      s->ring->pop();
      ++left;
    }
    s->dropped.fetch_add(left, std::memory_order_relaxed);
  }
  m.retired_dropped.fetch_add(s->dropped.load(std::memory_order_relaxed), std::memory_order_relaxed);
  m.reclaim();
  return BALLAST_OK;
}

int Bus::publish(const ballast_event& event) {
  Impl& m = *impl_;
  if (!rcu::enter()) return fail(BALLAST_ENOMEM, "bus: too many threads publish at once");
  struct Leave {
    ~Leave() { rcu::leave(); }
  } leave;
  // After shutdown() only handlers run by the bus's own dispatchers may
  // still publish: what they publish is part of draining the queues.
  if (m.closed.load(std::memory_order_relaxed) && (t_dispatcher == nullptr || t_dispatcher->bus != &m))
    return fail(BALLAST_ESTATE, "bus: publish after shutdown");
  const char* why = nullptr;
  if (!codec::check_event(event, &why))
    return fail(BALLAST_EINVAL, std::string("bus: publish: ") + why +
                                    (event.topic != nullptr ? std::string(" (topic ") + event.topic + ")" : ""));
  const size_t n = std::strlen(event.topic);
  const uint64_t h = hash_topic(event.topic, n);
  Topic* topic = m.lookup(event.topic, n, h);
  if (topic == nullptr) {
    if (int rc = m.intern(event.topic, n, h, &topic); rc != BALLAST_OK) return rc;
  }
  ThreadCounters& c = m.counters[rcu::t_state.index_plus_one - 1];
  bump(c.published, 1);
  const SubList* list = topic->subs.load(std::memory_order_acquire);
  uint64_t delivered = 0, failures = 0;
  bool queued = false;
  size_t flat_bytes = 0;
  ballast_event flat_ev{};
  for (const Entry& e : list->entries) {
    if (!e.sub->alive.load(std::memory_order_relaxed)) continue;
    if (!e.queued) {
      ++delivered;
      if (call(e.handler, e.user, event) < 0) ++failures;
      continue;
    }
    thread_local std::vector<uint64_t> scratch;  // one flattened copy for several queues
    m.enqueue(*e.sub, event, *topic, list->queued == 1, scratch, flat_bytes, flat_ev);
    queued = true;
  }
  if (delivered > 0) bump(c.delivered, delivered);
  if (failures > 0) bump(c.failures, failures);
  if (queued) {
    // Pairs with the full barrier of a dispatcher going to sleep: either it
    // sees the new events, or we see it asleep and wake it.
    rcu::light_barrier();
    for (auto& d : m.dispatchers)
      if (d->sleeping.load(std::memory_order_relaxed)) d->wake_sleeper();
  }
  return BALLAST_OK;
}

void Bus::shutdown() {
  Impl& m = *impl_;
  m.closed.store(true, std::memory_order_seq_cst);
  // Publishers already inside publish() finish (those blocked on a full
  // queue are unblocked by the dispatchers, which still run).
  rcu::synchronize(help_if_dispatcher, t_dispatcher != nullptr);
  for (auto& d : m.dispatchers) {
    d->stopping.store(true, std::memory_order_release);
    d->wake();
  }
  if (t_dispatcher != nullptr && t_dispatcher->bus == &m) return;  // a handler: the destructor joins
  {
    std::lock_guard<std::mutex> lock(m.join_mu);
    if (m.joined) return;
    for (auto& d : m.dispatchers) d->thread.join();
    m.joined = true;
  }
  m.reclaim();
}

BusStats Bus::stats() const {
  Impl& m = *impl_;
  BusStats st;
  for (unsigned i = 0; i < rcu::kMaxThreads; ++i) {
    st.published += m.counters[i].published.load(std::memory_order_relaxed);
    st.delivered += m.counters[i].delivered.load(std::memory_order_relaxed);
    st.handler_failures += m.counters[i].failures.load(std::memory_order_relaxed);
  }
  for (auto& d : m.dispatchers) {
    st.delivered += d->delivered.load(std::memory_order_relaxed);
    st.handler_failures += d->failures.load(std::memory_order_relaxed);
  }
  st.dropped = m.retired_dropped.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(m.mu);
  for (auto& [id, s] : m.subs) st.dropped += s->dropped.load(std::memory_order_relaxed);
  st.subscriptions = m.subs.size();
  st.topics = m.topics.size();
  return st;
}

uint64_t Bus::dropped(uint64_t id) const {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.subs.find(id);
  return it == m.subs.end() ? 0 : it->second->dropped.load(std::memory_order_relaxed);
}

}  // namespace ballast
