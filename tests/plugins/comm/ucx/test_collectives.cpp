// Every operation and dtype of the UCX comm plugin, run by 2, 3, 4 and 8
// real processes over shared memory and over tcp, checked against a
// reference computed here in double precision from the same inputs.
#include <doctest/doctest.h>

#include "ranks.hpp"

#include <cmath>
#include <cstring>

using namespace ballast::comm;

namespace {

// Inputs are small integers, so that every sum and product below is exact
// in every dtype (f16 included) and the reference needs no tolerance.
double input(int rank, uint64_t i, uint32_t redop) {
  if (redop == BALLAST_RED_PROD) return double((rank + i) % 2 + 1);
  return double((uint64_t(rank) * 5 + i * 3) % 13) + 1;
}

void put(char* p, uint32_t dt, uint64_t i, double v) {
  switch (dt) {
    case BALLAST_DT_F32: {
      const float f = float(v);
      std::memcpy(p + 4 * i, &f, 4);
      break;
    }
    case BALLAST_DT_F64:
      std::memcpy(p + 8 * i, &v, 8);
      break;
    case BALLAST_DT_I32: {
      const int32_t x = int32_t(v);
      std::memcpy(p + 4 * i, &x, 4);
      break;
    }
    case BALLAST_DT_I64: {
      const int64_t x = int64_t(v);
      std::memcpy(p + 8 * i, &x, 8);
      break;
    }
    case BALLAST_DT_U8:
      p[i] = char(uint8_t(uint64_t(v) % 256));
      break;
    case BALLAST_DT_BF16: {  // exact for integers below 256
      const float f = float(v);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      const uint16_t h = uint16_t(b >> 16);
      std::memcpy(p + 2 * i, &h, 2);
      break;
    }
    default: {  // f16 from frexp: exact for integers below 2048
      int e = 0;
      const double m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
      const uint16_t h = v == 0 ? 0 : uint16_t(((e - 1 + 15) << 10) | uint16_t((m * 2 - 1) * 1024));
      std::memcpy(p + 2 * i, &h, 2);
    }
  }
}

double get(const char* p, uint32_t dt, uint64_t i) {
  switch (dt) {
    case BALLAST_DT_F32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case BALLAST_DT_F64: {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      return d;
    }
    case BALLAST_DT_I32: {
      int32_t x;
      std::memcpy(&x, p + 4 * i, 4);
      return x;
    }
    case BALLAST_DT_I64: {
      int64_t x;
      std::memcpy(&x, p + 8 * i, 8);
      return double(x);
    }
    case BALLAST_DT_U8:
      return uint8_t(p[i]);
    case BALLAST_DT_BF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      const uint32_t b = uint32_t(h) << 16;
      float f;
      std::memcpy(&f, &b, 4);
      return f;
    }
    default: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      const int e = (h >> 10) & 0x1f;
      return h == 0 ? 0.0 : std::ldexp(1.0 + (h & 0x3ff) / 1024.0, e - 15);
    }
  }
}

double reduce_ref(int n, uint64_t i, uint32_t redop, uint32_t dt) {
  double acc = input(0, i, redop);
  for (int r = 1; r < n; ++r) {
    const double x = input(r, i, redop);
    acc = redop == BALLAST_RED_SUM    ? acc + x
          : redop == BALLAST_RED_PROD ? acc * x
          : redop == BALLAST_RED_MIN  ? std::min(acc, x)
                                      : std::max(acc, x);
  }
  return dt == BALLAST_DT_U8 ? double(uint64_t(acc) % 256) : acc;
}

struct Checker {
  Comm* comm;
  int rank, n;
  std::string failure;
  bool in_place = false;  // allreduce with sendbuf == recvbuf

  bool run(ballast_comm_args& a) {
    a.size = sizeof a;
    const int rc = comm_run(comm, &a);
    if (rc != BALLAST_OK) failure = std::string(ballast_op_name(a.op)) + ": " + last_error();
    return rc == BALLAST_OK;
  }

  // One operation, one dtype, `count` elements (per rank where the op says so).
  bool check(uint32_t op, uint32_t dt, uint32_t redop, uint64_t count, int root) {
    const size_t es = ballast_dtype_size(dt);
    const uint64_t nin = (op == BALLAST_OP_REDUCE_SCATTER || op == BALLAST_OP_ALLTOALL) ? count * uint64_t(n) : count;
    const uint64_t nout = (op == BALLAST_OP_ALLGATHER || op == BALLAST_OP_ALLTOALL) ? count * uint64_t(n) : count;
    std::vector<char> in(nin * es + 1), out(nout * es + 1, char(0x5a));
    for (uint64_t i = 0; i < nin; ++i) put(in.data(), dt, i, input(rank, i, redop));
    ballast_comm_args a{};
    a.op = op;
    a.dtype = dt;
    a.redop = redop;
    a.sendbuf = in.data();
    a.recvbuf = out.data();
    a.count = count;
    a.root = root;
    const bool here = in_place && op == BALLAST_OP_ALLREDUCE;
    if (here) {
      std::memcpy(out.data(), in.data(), nin * es);
      a.sendbuf = out.data();
    }
    if (!run(a)) return false;
    // The input still holds what put() wrote, byte for byte, its spare byte
    // included: compared element by element rather than against a copy made
    // before, a second buffer as large as the input (64 MiB at most) in each
    // check.
    bool intact = in[nin * es] == 0;
    for (uint64_t i = 0; i < nin && intact; ++i) {
      char want[8];
      put(want, dt, 0, input(rank, i, redop));
      for (size_t b = 0; b < es; ++b) intact = intact && in[i * es + b] == want[b];
    }
    if (!intact) {
      failure = std::string(ballast_op_name(op)) + " " + ballast_dtype_name(dt) + " count " + std::to_string(count) +
                " changed its input buffer";
      return false;
    }
    for (uint64_t i = 0; i < nout; ++i) {
      double want;
      switch (op) {
        case BALLAST_OP_ALLREDUCE:
          want = reduce_ref(n, i, redop, dt);
          break;
        case BALLAST_OP_REDUCE:
          if (rank != root) return true;
          want = reduce_ref(n, i, redop, dt);
          break;
        case BALLAST_OP_BROADCAST:
          want = input(root, i, redop);
          break;
        case BALLAST_OP_ALLGATHER:
          want = input(int(i / count), i % count, redop);
          break;
        case BALLAST_OP_REDUCE_SCATTER:
          want = reduce_ref(n, uint64_t(rank) * count + i, redop, dt);
          break;
        default:
          want = input(int(i / count), uint64_t(rank) * count + i % count, redop);
          break;  // alltoall
      }
      const double got = get(out.data(), dt, i);
      if (got != want) {
        failure = std::string(ballast_op_name(op)) + (here ? " in place " : " ") + ballast_dtype_name(dt) + " " +
                  ballast_redop_name(redop) + " count " + std::to_string(count) + " root " + std::to_string(root) +
                  ": element " + std::to_string(i) + " is " + std::to_string(got) + ", expected " +
                  std::to_string(want);
        return false;
      }
    }
    return true;
  }

  // Allreduce out of place reads its input where it is (the ring reduces
  // input + received into the output), in place it works in the output.
  bool all_ops(const std::vector<uint64_t>& counts) {
    for (uint32_t dt = 0; dt < BALLAST_DT_COUNT; ++dt)
      for (uint64_t count : counts) {
        for (uint32_t redop = 0; redop < BALLAST_RED_COUNT; ++redop)
          for (const bool place : {false, true}) {
            in_place = place;
            const bool ok = check(BALLAST_OP_ALLREDUCE, dt, redop, count, 0);
            in_place = false;
            if (!ok) return false;
          }
        const int root = int(count % uint64_t(n));
        if (!check(BALLAST_OP_BROADCAST, dt, 0, count, root) || !check(BALLAST_OP_REDUCE, dt, 0, count, n - 1 - root) ||
            !check(BALLAST_OP_ALLGATHER, dt, 0, count, 0) || !check(BALLAST_OP_REDUCE_SCATTER, dt, 0, count, 0) ||
            !check(BALLAST_OP_ALLTOALL, dt, 0, count, 0))
          return false;
      }
    return true;
  }

  // Every rank sends to the next and receives from the previous.
  bool send_recv(uint64_t count) {
    std::vector<int32_t> s(count + 1), r(count + 1, -1);
    for (uint64_t i = 0; i < count; ++i) s[i] = int32_t(rank * 1000 + int(i));
    ballast_comm_args a{};
    a.dtype = BALLAST_DT_I32;
    a.count = count;
    for (int phase = 0; phase < 2; ++phase) {
      const bool sending = (rank % 2 == 0) == (phase == 0);
      a.op = sending ? BALLAST_OP_SEND : BALLAST_OP_RECV;
      a.root = sending ? (rank + 1) % n : (rank + n - 1) % n;
      a.sendbuf = s.data();
      a.recvbuf = r.data();
      if (n % 2 == 1 && ((rank == n - 1 && sending) || (rank == 0 && !sending))) continue;  // odd ring: skip the wrap
      if (!run(a)) return false;
      if (!sending)
        for (uint64_t i = 0; i < count; ++i)
          if (r[i] != int32_t(a.root * 1000 + int(i))) {
            failure = "recv from " + std::to_string(a.root) + ": element " + std::to_string(i) + " is " +
                      std::to_string(r[i]);
            return false;
          }
    }
    ballast_comm_args b{};
    b.op = BALLAST_OP_BARRIER;
    return run(b);
  }
};

// big_bytes: 0, or the size of one more round of every operation on one
// large buffer.
int worker(int rank, int n, int port, const std::vector<uint64_t>& counts, uint64_t big_bytes) {
  ballast_comm_config cfg = test::config(rank, n, port, 20000);
  Comm* comm = nullptr;
  if (int rc = comm_init(&cfg, &comm); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  Checker c{comm, rank, n, ""};
  bool ok = c.all_ops(counts) && c.send_recv(1) && c.send_recv(50001);
  if (ok && big_bytes) {
    const uint64_t whole = big_bytes / 4 + 3, part = whole / uint64_t(n) + 1;
    ok = c.check(BALLAST_OP_ALLREDUCE, BALLAST_DT_F32, BALLAST_RED_SUM, whole, 0) &&
         c.check(BALLAST_OP_BROADCAST, BALLAST_DT_F32, 0, whole, n - 1) &&
         c.check(BALLAST_OP_REDUCE, BALLAST_DT_F32, BALLAST_RED_MAX, whole, 0) &&
         c.check(BALLAST_OP_ALLGATHER, BALLAST_DT_F32, 0, part, 0) &&
         c.check(BALLAST_OP_REDUCE_SCATTER, BALLAST_DT_F32, BALLAST_RED_SUM, part, 0) &&
         c.check(BALLAST_OP_ALLTOALL, BALLAST_DT_F32, 0, part, 0);
  }
  // Sub-communicators: even and odd ranks, in reverse order; the last rank joins none.
  Comm* sub = nullptr;
  const int colour = (n > 2 && rank == n - 1) ? BALLAST_COMM_UNDEFINED : rank % 2;
  if (ok && comm_split(comm, colour, -rank, &sub) != BALLAST_OK) {
    c.failure = std::string("split: ") + last_error();
    ok = false;
  }
  if (ok && colour != BALLAST_COMM_UNDEFINED) {
    ballast_comm_info info{};
    info.size = sizeof info;
    comm_info(sub, &info);
    int members = 0, my_index = 0;
    for (int r = n - 1; r >= 0; --r)
      if (r % 2 == colour && !(n > 2 && r == n - 1)) {
        if (r == rank) my_index = members;
        ++members;
      }
    if (info.nranks != members || info.rank != my_index) {
      c.failure = "split: rank " + std::to_string(info.rank) + " of " + std::to_string(info.nranks) + ", expected " +
                  std::to_string(my_index) + " of " + std::to_string(members);
      ok = false;
    }
    int32_t v = rank, sum = 0;
    ballast_comm_args a{};
    a.size = sizeof a;
    a.op = BALLAST_OP_ALLREDUCE;
    a.dtype = BALLAST_DT_I32;
    a.sendbuf = &v;
    a.recvbuf = &sum;
    a.count = 1;
    int want = 0;
    for (int r = 0; r < n; ++r)
      if (r % 2 == colour && !(n > 2 && r == n - 1)) want += r;
    if (ok && (comm_run(sub, &a) != BALLAST_OK || sum != want)) {
      c.failure = "allreduce on the sub-communicator gave " + std::to_string(sum) + ", expected " +
                  std::to_string(want) + " " + last_error();
      ok = false;
    }
    // Every op on the sub-communicator, its ranks numbered as it numbers them.
    Checker s{sub, info.rank, info.nranks, ""};
    if (ok && !(s.all_ops({1, 37, 12289}) && (info.nranks < 2 || s.send_recv(4097)))) {
      c.failure = "on the sub-communicator: " + s.failure;
      ok = false;
    }
    // A split of the split: halves of the sub-communicator, by its ranks.
    Comm* subsub = nullptr;
    if (ok && comm_split(sub, info.rank * 2 / info.nranks, info.rank, &subsub) != BALLAST_OK) {
      c.failure = std::string("split of a split: ") + last_error();
      ok = false;
    }
    if (ok) {
      ballast_comm_info inner{};
      inner.size = sizeof inner;
      comm_info(subsub, &inner);
      Checker ss{subsub, inner.rank, inner.nranks, ""};
      if (!ss.all_ops({37})) {
        c.failure = "on a split of a split: " + ss.failure;
        ok = false;
      }
    }
    comm_destroy(subsub);
  }
  if (ok) ok = c.check(BALLAST_OP_ALLREDUCE, BALLAST_DT_F32, BALLAST_RED_SUM, 1001, 0);  // the parent still works
  comm_destroy(sub);
  comm_destroy(comm);
  return ok ? 0 : test::child_fail(rank, BALLAST_EINTERNAL, c.failure);
}

// chunk_bytes: 16 KiB by default, for many chunks and sizes that are not a
// multiple of one; nullptr for the plugin's own choice.
void expect_all_pass(int n, const char* tls, bool big, std::vector<uint64_t> counts = {0, 1, 37, 12289},
                     const char* chunk_bytes = "16384") {
  if (chunk_bytes)
    setenv("BALLAST_COMM_CHUNK_BYTES", chunk_bytes, 1);
  else
    unsetenv("BALLAST_COMM_CHUNK_BYTES");
  // With big: 64 MiB and a little more in the buffer each operation reads or
  // writes in full over shared memory, 16 MiB over tcp (loopback tcp moves
  // them 4x slower, and 16 MiB is already 32 of its 512 KiB chunks); 8 and
  // 4 MiB under ASan, which checks every access and runs these 10x slower.
  const bool tcp = std::strcmp(tls, "tcp") == 0;
#if defined(__SANITIZE_ADDRESS__)
  const uint64_t big_bytes = !big ? 0 : tcp ? 4u << 20 : 8u << 20;
#else
  const uint64_t big_bytes = !big ? 0 : tcp ? 16u << 20 : 64u << 20;
#endif
  const int port = test::reserve_ports(1);
  const auto res = test::run_ranks(n, tls, 150, [&](int r) { return worker(r, n, port, counts, big_bytes); });
  for (int r = 0; r < n; ++r) {
    INFO("ranks=" << n << " tls=" << std::string(tls) << " rank " << r << ": " << test::read_err(r));
    CHECK(res.codes[size_t(r)] == 0);
  }
}

// The same operations on the same buffers three times over, with new inputs
// each time, as a trainer repeats its collectives: an operation whose plan
// is kept from the last one still starts with its own copies (input into
// output, its block into the gathered buffer) and gives its own result.
// Then two allreduces in flight, the second growing the scratch buffer,
// and the first's arguments again on both requests: a kept plan must not
// point into the scratch buffer the growth freed (caught by the asan preset).
int repeat_worker(int rank, int n, int port) {
  auto cfg = test::config(rank, n, port, 30000);
  Comm* comm = nullptr;
  if (int rc = comm_init(&cfg, &comm); rc != BALLAST_OK) return test::child_fail(rank, rc, last_error());
  const size_t nn = size_t(n);
  std::vector<float> in(70001 * nn), out(70001 * nn), small_in(3), small_out(3), mine(5), all(5 * nn);
  std::string what;
  auto run = [&](uint32_t op, void* send, void* recv, uint64_t count, int root) {
    const ballast_comm_args a = test::args_of(op, send, recv, count, BALLAST_DT_F32, root);
    if (comm_run(comm, &a) == BALLAST_OK) return true;
    what = std::string(ballast_op_name(op)) + ": " + last_error();
    return false;
  };
  auto value = [](int r, size_t i, int it) { return float(r * 10 + int(i % 5) + it * 100); };
  auto sum = [&](size_t i, int it) {
    float s = 0;
    for (int r = 0; r < n; ++r) s += value(r, i, it);
    return s;
  };
  for (int it = 0; it < 3 && what.empty(); ++it) {
    const std::string round = " (round " + std::to_string(it) + ")";
    for (size_t i = 0; i < small_in.size(); ++i) small_in[i] = value(rank, i, it);
    run(BALLAST_OP_ALLREDUCE, small_in.data(), small_out.data(), 3, 0);
    for (size_t i = 0; i < 3 && what.empty(); ++i)
      if (small_out[i] != sum(i, it)) what = "small allreduce" + round;
    for (size_t i = 0; i < 70001; ++i) in[i] = value(rank, i, it);
    if (what.empty()) run(BALLAST_OP_ALLREDUCE, in.data(), out.data(), 70001, 0);
    for (size_t i = 0; i < 70001 && what.empty(); ++i)
      if (out[i] != sum(i, it)) what = "allreduce" + round;
    if (what.empty()) run(BALLAST_OP_REDUCE, small_in.data(), small_out.data(), 3, 1);
    for (size_t i = 0; i < 3 && what.empty() && rank == 1; ++i)
      if (small_out[i] != sum(i, it)) what = "reduce" + round;
    if (what.empty()) run(BALLAST_OP_BROADCAST, small_in.data(), small_out.data(), 3, 1);
    for (size_t i = 0; i < 3 && what.empty(); ++i)
      if (small_out[i] != value(1, i, it)) what = "broadcast" + round;
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = value(rank, i, it);
    if (what.empty()) run(BALLAST_OP_ALLGATHER, mine.data(), all.data(), 5, 0);
    for (size_t i = 0; i < all.size() && what.empty(); ++i)
      if (all[i] != value(int(i / 5), i % 5, it)) what = "allgather" + round;
    for (size_t i = 0; i < all.size(); ++i) all[i] = value(rank, i, it);  // block r goes to rank r
    if (what.empty()) run(BALLAST_OP_ALLTOALL, all.data(), out.data(), 5, 0);
    for (size_t i = 0; i < all.size() && what.empty(); ++i)
      if (out[i] != value(int(i / 5), size_t(rank) * 5 + i % 5, it)) what = "alltoall" + round;
  }
  // In place: 2 elements (recursive doubling or one round, through the
  // scratch buffer) in flight with 70001 (a ring or halving, whose staging
  // grows it); then 2 elements twice in flight, the second on the same
  // request as the first before (requests are pooled: the last one handed
  // back is the first one reused) and with the same arguments.
  std::vector<float> a(2), b(2);
  auto start = [&](float* buf, uint64_t count, ballast_comm_request** req) {
    for (uint64_t i = 0; i < count; ++i) buf[i] = float(rank + 1);
    const ballast_comm_args a = test::args_of(BALLAST_OP_ALLREDUCE, buf, buf, count);
    if (comm_start(comm, &a, req) == BALLAST_OK) return true;
    what = "start: " + std::string(last_error());
    return false;
  };
  const float want = float(n * (n + 1) / 2);
  for (int pass = 0; pass < 2 && what.empty(); ++pass) {
    ballast_comm_request* r[2] = {nullptr, nullptr};
    if (pass == 0 && !(start(a.data(), 2, &r[0]) && start(out.data(), 70001, &r[1]))) break;
    if (pass == 1 && !(start(b.data(), 2, &r[0]) && start(a.data(), 2, &r[1]))) break;
    for (auto* req : r)
      if (comm_wait(req) != BALLAST_OK && what.empty()) what = "in flight: " + std::string(last_error());
    const float* second = pass == 0 ? out.data() : b.data();
    for (int k = 0; k < 2 && what.empty(); ++k)
      if (a[size_t(k)] != want || second[k] != want) what = "in flight, pass " + std::to_string(pass);
  }
  comm_destroy(comm);
  return what.empty() ? 0 : test::child_fail(rank, BALLAST_EIO, what);
}

}  // namespace

TEST_CASE("operations repeated on the same buffers: each gives its own result") {
  for (const char* tls : {"sm,self", "tcp"})
    for (int n : {2, 4}) {
      const int port = test::reserve_ports(1);
      const auto res = test::run_ranks(n, tls, 60, [&](int r) { return repeat_worker(r, n, port); });
      for (int r = 0; r < n; ++r) {
        INFO(tls, " ", n, " ranks, rank ", r, ": ", test::read_err(r));
        CHECK(res.codes[size_t(r)] == 0);
      }
    }
}

TEST_CASE("2 ranks over shared memory: every op and dtype, sizes 0, 1, odd, many chunks, 64 MiB") {
  expect_all_pass(2, "sm,self", true);
}
TEST_CASE("2 ranks over tcp: every op and dtype, sizes 0, 1, odd, many chunks, 16 MiB") {
  expect_all_pass(2, "tcp", true);
}
TEST_CASE("3 ranks over tcp: every op and dtype, non-power-of-two") { expect_all_pass(3, "tcp", false); }
// With tcp's own chunk (512 KiB, the rendezvous threshold too): eager
// messages under it, the 2-rank whole-buffer swap from 128 KiB to 1 MiB
// (70001 elements of 2 and 4 bytes eager, of 8 bytes by rendezvous; 262144
// f32) and the ring just above it.
TEST_CASE("2 and 4 ranks over tcp with the default chunk: eager, swap and ring sizes") {
  for (int n : {2, 4}) expect_all_pass(n, "tcp", false, {12289, 70001, 262144, 262147}, nullptr);
}
// With the plugin's own chunk over shared memory: 2 ranks swap whole
// buffers from 128 KiB to 4 MiB (70001 elements of 2 bytes and more,
// 1100000 of 1 and 2 bytes), the ring above (1100000 of 4 and 8 bytes).
TEST_CASE("2 ranks over shared memory with the default chunk: eager, swap and ring sizes") {
  expect_all_pass(2, "sm,self", false, {12289, 70001, 1100000}, nullptr);
}
TEST_CASE("4 ranks over shared memory: every op and dtype") { expect_all_pass(4, "sm,self", false); }
TEST_CASE("4 ranks over tcp: every op and dtype") { expect_all_pass(4, "tcp", false); }
TEST_CASE("3 ranks over shared memory: every op and dtype, non-power-of-two") { expect_all_pass(3, "sm,self", false); }
TEST_CASE("8 ranks over shared memory: every op and dtype, sizes 0, 1, odd, many chunks") {
  expect_all_pass(8, "sm,self", false);
}
TEST_CASE("8 ranks over tcp: every op and dtype, sizes 0, 1, odd, many chunks") { expect_all_pass(8, "tcp", false); }
// The ring overlaps its steps: a step forwards chunk k of the block it just
// received while later chunks are in flight, with at most 8 chunks in flight
// over all steps. Blocks of about 40,000 elements (10 and more 16 KiB chunks,
// the last one partial) and blocks of unequal sizes (the count is not a
// multiple of the world) make the window wrap inside a block and across steps.
TEST_CASE("3 ranks over shared memory: ring steps overlapped, blocks of more chunks than in flight, uneven blocks") {
  expect_all_pass(3, "sm,self", false, {120001});
}

// Out of place, large rings receive into the output and reduce there
// (BALLAST_COMM_RING_DIRECT_BYTES, 4 MiB by default): the same sizes with
// that path taken at every size.
TEST_CASE("3 ranks over shared memory: ring receiving into the output, every op and dtype, uneven blocks") {
  setenv("BALLAST_COMM_RING_DIRECT_BYTES", "0", 1);
  expect_all_pass(3, "sm,self", false, {12289, 120001});
  unsetenv("BALLAST_COMM_RING_DIRECT_BYTES");
}

// Allreduce by recursive halving and doubling (4 ranks, up to 512 KiB): 70001
// elements split into uneven blocks, the first halving step's half of 9 and
// more 16 KiB chunks (more than in flight, staged and reduced chunk by chunk).
// One round to all (tiny sizes) is covered by the 4- and 8-rank cases above.
TEST_CASE("4 ranks over shared memory: recursive halving and doubling, more chunks than in flight, uneven blocks") {
  expect_all_pass(4, "sm,self", false, {70001});
}
