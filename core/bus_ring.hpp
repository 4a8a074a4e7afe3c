// The bounded queue of one queued subscription.
//
// Many publishers, one consumer (the subscription's dispatcher). A publisher
// claims a position with one CAS on the tail, fills the slot, then publishes
// it by storing the slot's sequence number (position + 1), so that
// positions, and with them the events of any one publisher, are consumed in
// order. The consumer reads a slot once its sequence says it holds the
// position it expects, and frees it by moving the head: it never writes to
// the slots, so a slot's lines travel from publisher to consumer and not
// back (a publisher taking one again only invalidates the consumer's copy).
// Publishers check for room against the head as last seen, and read the
// consumer's head (a line the consumer writes at every event) only when
// that says the ring is full.
//
// Consecutive positions are not in adjacent slots: position p lives in slot
// (p * an odd constant) mod capacity, a permutation of the slots. With
// adjacent slots the hardware prefetchers of the dispatcher's core, which
// reads slots in order right behind the publisher, fetched the slots the
// publisher was writing at that moment and took their lines away from it.
// Queued delivery from one producer, alternating runs on the development
// VM: 10.3-11.9 M events/s adjacent against 12.5-14.2 M spread with the
// default 4096 slots (and 9.5-10.4 against 16-17 M with 16384 spread over
// the whole ring); nothing gained with 256, and spreading over blocks of
// 256 or 1024 slots in a 4096 ring lost most of the gain. The constant was
// picked by measurement: some odd constants (0xC15, 0x2F5) gained little
// here, presumably from how their strides fall in the caches' sets.
//
// A slot holds a deep copy of the event, flattened (codec_flat.hpp) into
// the slot's own inline buffer when it fits, else into a heap buffer that
// the slot keeps and reuses: after warm-up no event allocates. The slots
// are allocated once, at subscribe time.
#pragma once

#include "codec_flat.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ballast {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Whether the CPU has PREFETCHW (CPUID 0x80000001, ECX bit 8).
inline const bool kHasPrefetchw = [] {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(0x80000001u, &a, &b, &c, &d) != 0 && (c & (1u << 8)) != 0;
}();
#endif

class Ring {
 public:
  // Bytes of a slot's inline buffer: a metric batch of one sample with its
  // strings, a fault report or a recovery action fit.
  static constexpr size_t kInline = 176;
  // Slots a run of consecutive positions is spread over (see the top of the
  // file). Larger rings keep blocks of this size in order, so that a large
  // backlog is still written and read block by block (1.25 MB each) rather
  // than at random over the whole ring.
  static constexpr uint32_t kSpreadSlots = 4096;

  struct alignas(64) Slot {
    std::atomic<uint64_t> seq{0};
    ballast_event event{};          // the copy; event.topic == nullptr: lost (no memory)
    unsigned char* heap = nullptr;  // grown on demand, kept for the next events
    size_t heap_size = 0;
    alignas(codec::kFlatAlign) unsigned char inline_buf[kInline];
  };

  // capacity is rounded up to a power of two, at least 2.
  explicit Ring(uint32_t capacity) {
    uint32_t cap = 2;
    while (cap < capacity) cap <<= 1;
    mask_ = cap - 1;
    spread_mask_ = std::min<uint32_t>(mask_, kSpreadSlots - 1);
    slots_.reset(new Slot[cap]);
  }
  ~Ring() {
    for (uint32_t i = 0; i <= mask_; ++i) delete[] reinterpret_cast<uint64_t*>(slots_[i].heap);
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  uint32_t capacity() const { return mask_ + 1; }

  // Claim a slot; nullptr when the ring is full. The caller fills it (its
  // inline buffer, or buffer()) and then must call commit() on it.
  Slot* claim(uint64_t* pos) {
    uint64_t p = tail_.load(std::memory_order_relaxed);
    for (;;) {
      // Signed: p may be older than the head another publisher saw (then
      // the CAS below fails and p is reloaded).
      if (static_cast<int64_t>(p - head_seen_.load(std::memory_order_acquire)) > static_cast<int64_t>(mask_)) {
        const uint64_t h = head_.load(std::memory_order_acquire);
        head_seen_.store(h, std::memory_order_release);
        if (static_cast<int64_t>(p - h) > static_cast<int64_t>(mask_)) return nullptr;  // full
      }
      if (tail_.compare_exchange_weak(p, p + 1, std::memory_order_relaxed)) {
        *pos = p;
        prefetch_for_write(p + 2);  // the lines the next publishes will write
        return &slot(p);
      }
    }
  }

  // The buffer of `bytes` for a claimed slot; nullptr when it cannot be had.
  static unsigned char* buffer(Slot& s, size_t bytes) {
    if (bytes <= kInline) return s.inline_buf;
    if (bytes > s.heap_size) {
      // Sized in units of 8 bytes (kFlatAlign); operator new aligns them.
      auto* fresh = new (std::nothrow) uint64_t[(bytes + 7) / 8];
      if (fresh == nullptr) return nullptr;
      delete[] reinterpret_cast<uint64_t*>(s.heap);
      s.heap = reinterpret_cast<unsigned char*>(fresh);
      s.heap_size = (bytes + 7) / 8 * 8;
    }
    return s.heap;
  }

  static void commit(Slot& s, uint64_t pos) { s.seq.store(pos + 1, std::memory_order_release); }

  // Consumer side (one thread at a time).
  Slot* front() {
    // No prefetch ahead here: the slots ahead are usually being written by
    // a publisher right now, and reading them would take their lines away
    // from it (this alone cost a third of the queued throughput).
    const uint64_t h = head_.load(std::memory_order_relaxed);
    Slot& s = slot(h);
    return s.seq.load(std::memory_order_acquire) == h + 1 ? &s : nullptr;
  }
  void pop() { head_.store(head_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  // Any thread: positions claimed and not yet consumed (a moment's view).
  uint64_t size() const {
    const uint64_t h = head_.load(std::memory_order_acquire);  // first: the tail read after it is not behind it
    return tail_.load(std::memory_order_acquire) - h;
  }
  // Any thread: whether no claimed position is left unconsumed.
  bool empty() const { return head_.load(std::memory_order_acquire) == tail_.load(std::memory_order_acquire); }

 private:
  // Take the lines of the slot at `pos` in exclusive state ahead of writing
  // them. The consumer read them last (they sit in its cache): a plain
  // prefetch would fetch them shared, and the stores would still wait for
  // ownership (GCC emits PREFETCHW only when built for a CPU that has it).
  void prefetch_for_write(uint64_t pos) const {
    const auto* p = reinterpret_cast<const char*>(&slot(pos));
    for (size_t off = 0; off < sizeof(Slot); off += 64) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
      if (kHasPrefetchw) {
        asm volatile("prefetchw %0" : : "m"(p[off]));
        continue;
      }
#endif
      __builtin_prefetch(p + off, 1);
    }
  }

  // The slot of a position (see the top of the file): spread within blocks
  // of kSpreadSlots, the blocks in order. Multiplying by an odd number is a
  // bijection modulo any power of two.
  Slot& slot(uint64_t pos) const {
    return slots_[((pos & ~uint64_t{spread_mask_}) | ((pos * 0x9E37u) & spread_mask_)) & mask_];
  }

  // Read-only after construction, and read by every claim: on a line of
  // their own, so that the consumer's writes to head_ do not take it away
  // from the publishers at every event.
  alignas(64) uint32_t mask_ = 0;
  uint32_t spread_mask_ = 0;
  std::unique_ptr<Slot[]> slots_;
  alignas(64) std::atomic<uint64_t> tail_{0};  // next position to claim
  std::atomic<uint64_t> head_seen_{0};         // head_ as publishers last read it (<= head_)
  alignas(64) std::atomic<uint64_t> head_{0};  // next position to consume (written by the consumer)
  // (alignas(64) members round the size up: nothing else shares head_'s line)
};

}  // namespace ballast
