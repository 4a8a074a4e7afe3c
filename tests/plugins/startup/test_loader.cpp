#include <doctest/doctest.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>

#include "helpers.hpp"
#include "striped_read.hpp"

using namespace ballast::startup;
using startup_test::TempDir;
using startup_test::write_text;
namespace fs = std::filesystem;

namespace {

std::string le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(char(v >> (8 * i)));
  return s;
}

// A safetensors file with the given header JSON and data bytes.
void write_st(const std::string& path, const std::string& header, const std::string& data) {
  write_text(path, le64(header.size()) + header + data);
}

// Two F32 tensors and one BF16 tensor; returns the data section.
std::string write_model(const std::string& path, size_t n) {
  std::string data = startup_test::pattern(4 * n + 4 * n + 2 * 6, 42);
  std::string h = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[)" + std::to_string(n) +
                  R"(],"data_offsets":[0,)" + std::to_string(4 * n) + R"(]},"b":{"dtype":"F32","shape":[2,)" +
                  std::to_string(n / 2) + R"(],"data_offsets":[)" + std::to_string(4 * n) + "," +
                  std::to_string(8 * n) + R"(]},"c":{"dtype":"BF16","shape":[2,3],"data_offsets":[)" +
                  std::to_string(8 * n) + "," + std::to_string(8 * n + 12) + "]}}";
  h.append((8 - h.size() % 8) % 8, ' ');
  write_st(path, h, data);
  return data;
}

}  // namespace

TEST_CASE("striped loads give the file's exact bytes whatever the stripes, chunk size and I/O mode") {
  TempDir d;
  std::string data = write_model(d / "m.safetensors", 3 * 1024 * 1024 + 18);
  std::string whole = startup_test::read_text(d / "m.safetensors");
  uint32_t reference = 0;
  for (unsigned stripes : {1u, 3u, 8u}) {
    for (int direct : {-1, 0, 1}) {  // -1 (the default) and 0: mapped, through the page cache
      LoadOptions o;
      o.stripes = stripes;
      o.chunk_bytes = 1 << 20;
      o.direct = direct;
      LoadedFile f = load_file(d / "m.safetensors", o);
      CAPTURE(stripes);
      CAPTURE(direct);
      REQUIRE(f.size == whole.size());
      CHECK(std::memcmp(f.data, whole.data(), whole.size()) == 0);
      CHECK(f.direct == (direct == 1));
      CHECK(f.mapped == (direct != 1));
      if (reference == 0) reference = f.checksum;
      CHECK(f.checksum == reference);
      REQUIRE(f.header.tensors.size() == 3);
    }
  }
  LoadedFile f = load_file(d / "m.safetensors", LoadOptions{});
  const TensorInfo* b = nullptr;
  for (auto& t : f.header.tensors)
    if (t.name == "b") b = &t;
  REQUIRE(b != nullptr);
  CHECK(b->shape == std::vector<int64_t>{2, (3 * 1024 * 1024 + 18) / 2});
  CHECK(std::memcmp(f.data + f.header.data_offset + b->begin, data.data() + b->begin, b->end - b->begin) == 0);
}

TEST_CASE("a raw shard loads into the caller's page-aligned buffer, and a too-small one is refused") {
  TempDir d;
  std::string bytes = startup_test::pattern(5 * 1024 * 1024 + 100, 3);
  write_text(d / "shard.bin", bytes);
  size_t cap = (bytes.size() + 4095) / 4096 * 4096;
  void* buf = ::mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(buf != MAP_FAILED);
  LoadOptions o;
  o.destination = buf;
  o.capacity = cap;
  o.direct = 1;
  LoadedFile f = load_file(d / "shard.bin", o);
  CHECK(f.data == buf);
  CHECK(f.header.tensors.empty());
  CHECK(std::memcmp(buf, bytes.data(), bytes.size()) == 0);
  o.capacity = bytes.size() - 1;
  CHECK_THROWS_WITH_AS(load_file(d / "shard.bin", o), doctest::Contains("destination holds"), Error);
  ::munmap(buf, cap);
}

TEST_CASE("bad safetensors headers are refused with the field named") {
  TempDir d;
  std::string p = d / "x.safetensors";
  auto err = [&]() -> std::string {
    try {
      load_file(p, LoadOptions{});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  write_text(p, std::string("\x10\x00\x00", 3));
  CHECK(err() == p + ": truncated safetensors header (3 bytes, need 8 for the length)");
  write_text(p, le64(1000) + "{\"a\":1}");
  CHECK(err() == p + ": truncated safetensors header (says 1000 bytes, the file has 7 after the length)");
  write_text(p, le64(uint64_t(1) << 40) + "{}");
  CHECK(err().find("implausible") != std::string::npos);
  write_st(p, "{\"a\":", "");
  CHECK(err().find("header is not JSON") != std::string::npos);
  write_st(p, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, 'x'));
  CHECK(err() == p + ": tensor \"a\": data_offsets end 16 is past the data section (8 bytes): truncated file?");
  write_st(p, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", std::string(16, 'x'));
  CHECK(err() == p + ": tensor \"a\": 16 bytes for shape of 3 x F32");
  write_st(p, R"({"a":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})", std::string(16, 'x'));
  CHECK(err() == p + ": tensor \"a\": unknown dtype \"Q4\"");
  write_st(
      p,
      R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
      std::string(12, 'x'));
  CHECK(err() == p + ": tensors \"a\" and \"b\" overlap");
  write_st(p, R"({"a":{"dtype":"U8","shape":[8]}})", std::string(8, 'x'));
  CHECK(err() == p + ": tensor \"a\": field \"data_offsets\" must be [begin, end]");
  CHECK(err().find("ballast") == std::string::npos);
  // 2^61 eight-byte elements: 2^64 bytes, 0 once wrapped to 64 bits.
  write_st(p, R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})", "");
  CHECK(err() == p + ": tensor \"a\": 0 bytes for shape of 2305843009213693952 x F64");
  write_st(p, R"({"a":{"dtype":"F64","shape":[1024,1024,1024,2147483648],"data_offsets":[0,0]}})", "");
  CHECK(err() == p + ": tensor \"a\": 0 bytes for shape of 2305843009213693952 x F64");
  // A zero dimension first hid a dimension that does not fit int64.
  write_st(p, R"({"a":{"dtype":"U8","shape":[0,9223372036854775813],"data_offsets":[0,0]}})", "");
  CHECK(err() == p + ": tensor \"a\": field \"shape\" overflows");
  // One name twice: the JSON library would keep only the second.
  write_st(
      p, R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
      std::string(8, 'x'));
  CHECK(err() == p + ": safetensors header names tensor \"a\" twice");
}

TEST_CASE("checksums written once are verified on later loads; a changed byte is found by offset") {
  TempDir d;
  write_model(d / "m.safetensors", 600 * 1024);
  LoadOptions o;
  o.chunk_bytes = 1 << 20;
  LoadedFile first = load_file(d / "m.safetensors", o);
  write_sums(first);
  LoadOptions other = o;
  other.chunk_bytes = 2 << 20;  // the sums' chunk size wins
  LoadedFile second = load_file(d / "m.safetensors", other);
  CHECK(second.verified);
  CHECK(second.chunk_bytes == (1u << 20));
  CHECK(second.checksum == first.checksum);

  std::string bytes = startup_test::read_text(d / "m.safetensors");
  bytes[(1 << 20) + 5] ^= 1;
  write_text(d / "m.safetensors", bytes);
  CHECK_THROWS_WITH_AS(load_file(d / "m.safetensors", o),
                       doctest::Contains("checksum mismatch in bytes [1048576, 2097152) (chunk 1)"), Error);
  o.verify = false;
  CHECK_NOTHROW(load_file(d / "m.safetensors", o));
  bytes.push_back('x');  // the header still fits; the sums no longer do
  write_text(d / "m.safetensors", bytes);
  o.verify = true;
  CHECK_THROWS_WITH_AS(load_file(d / "m.safetensors", o), doctest::Contains("stale checksums or a changed file"),
                       Error);
}

// The shared-read segments present in /dev/shm now.
static std::set<std::string> ckpt_segments() {
  std::set<std::string> names;
  for (auto& e : fs::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind("ballast-ckpt-", 0) == 0) names.insert(e.path().filename().string());
  return names;
}

TEST_CASE("processes of one node sharing a load read the file once and all see the same bytes") {
  TempDir d;
  std::string bytes = startup_test::pattern(6 * 1024 * 1024 + 3, 9);
  write_text(d / "shard.bin", bytes);
  const uint32_t want = crc32c(bytes.data(), bytes.size());
  const std::set<std::string> before = ckpt_segments();
  const int n = 4;
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      LoadOptions o;
      o.share = true;
      o.chunk_bytes = 1 << 20;
      int code = 3;
      try {
        LoadedFile f = load_file(d / "shard.bin", o);
        bool same = f.size == bytes.size() && crc32c(f.data, f.size) == want;
        // Hold the mapping a moment so that the others find it.
        ::usleep(1000000);
        code = !same ? 2 : f.read_here ? 10 : 0;
      } catch (...) {
      }
      ::_exit(code);
    }
    kids.push_back(pid);
  }
  int readers = 0, mappers = 0;
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    REQUIRE(WIFEXITED(st));
    int c = WEXITSTATUS(st);
    CHECK((c == 0 || c == 10));
    readers += c == 10;
    mappers += c == 0;
  }
  // Children that start after the last one let go read again; with the
  // 1 s hold, in practice one reads and three map. At least one maps.
  CHECK(readers >= 1);
  CHECK(mappers >= 1);
  CHECK(readers + mappers == n);
  // The last user removed the segment: no segment beyond those that were
  // there before (other jobs' or tests' on this node).
  CHECK(ckpt_segments() == before);
}
