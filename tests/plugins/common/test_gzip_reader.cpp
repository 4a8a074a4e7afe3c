// Reading gzip of plugins/common (the metrics CSV of `ballast detect`, the
// straggler traces): several members, plain files, and every broken stream
// named for what it is.
#include <doctest/doctest.h>

#include "gzip_reader.hpp"

#include <zlib.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

using ballast::util::Gunzip;
using ballast::util::MaybeGzipFile;

namespace {

std::string gzip(const std::string& text, int level = 6) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&zs, uLong(text.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  zs.avail_in = uInt(text.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = uInt(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// Text that does not compress much: members and files span many chunks.
std::string noise(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s;
  while (s.size() < n) s += std::to_string(rng()) + (rng() % 7 == 0 ? "\n" : ",");
  return s;
}

std::string path_of(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (std::to_string(getpid()) + "-" + name)).string();
}

std::string write(const std::string& name, const std::string& bytes) {
  const std::string p = path_of(name);
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

// The whole of a file through read(); *error when it failed.
std::string read_all(const std::string& path, std::string* error) {
  MaybeGzipFile f;
  if (!f.open(path, error)) return "";
  std::string out;
  char buf[1000];  // small: many calls per member
  while (size_t n = f.read(buf, sizeof buf)) out.append(buf, n);
  if (f.failed()) *error = f.error();
  return out;
}

std::string gunzip_all(const std::string& bytes, std::string* error) {
  Gunzip z;
  z.feed(bytes.data(), bytes.size(), true);
  std::string out;
  char buf[4096];
  while (size_t n = z.read(buf, sizeof buf)) out.append(buf, n);
  if (z.failed()) *error = z.error();
  CHECK((z.done() || z.failed()));
  return out;
}

}  // namespace

TEST_CASE("a gzip file, several members (gzip -c a b > c), a plain file and an empty one read whole") {
  const std::string a = noise(300000, 1), b = noise(150000, 2);
  std::string error;
  CHECK(read_all(write("one.gz", gzip(a)), &error) == a);
  CHECK(error.empty());
  CHECK(read_all(write("two.gz", gzip(a) + gzip(b)), &error) == a + b);
  CHECK(error.empty());
  CHECK(read_all(write("plain.csv", a), &error) == a);
  CHECK(error.empty());
  CHECK(read_all(write("empty.csv", ""), &error).empty());
  CHECK(error.empty());
  CHECK(gunzip_all(gzip(a) + gzip("") + gzip(b), &error) == a + b);
  CHECK(error.empty());
}

TEST_CASE("a member boundary around the edge of the file's 64 KiB chunks is still one stream") {
  const std::string tail = gzip("tail\n");
  for (size_t target = 65536 - 3; target <= 65536 + 3; ++target) {
    // A stored (level 0) first member grows byte for byte with its text:
    // find the text that makes it end exactly at target.
    std::string text, first;
    size_t len = target - 40;
    for (int i = 0; i < 20; ++i) {
      text = std::string(len, 'a');
      first = gzip(text, 0);
      if (first.size() == target) break;
      len += target - first.size();
    }
    CAPTURE(target);
    REQUIRE(first.size() == target);
    std::string error;
    CHECK(read_all(write("edge.gz", first + tail), &error) == text + "tail\n");
    CHECK(error.empty());
  }
}

TEST_CASE("a truncated, a corrupt stream and garbage after its end are named") {
  const std::string a = noise(200000, 3), z = gzip(a);
  std::string error;
  SUBCASE("truncated") {
    const std::string got = read_all(write("cut.gz", z.substr(0, z.size() / 2)), &error);
    CHECK(error.find("truncated gzip stream") == 0);
    CHECK(a.compare(0, got.size(), got) == 0);  // what was read before is the text's start
    CHECK(gunzip_all(z.substr(0, z.size() - 4), &error).size() <= a.size());
    CHECK(error.find("truncated gzip stream") == 0);
  }
  SUBCASE("corrupt") {
    std::string bad = z;
    for (size_t i = 100; i < 200; ++i) bad[i] = char(~bad[i]);
    read_all(write("bad.gz", bad), &error);
    CHECK(error.find("corrupt gzip stream") == 0);
  }
  SUBCASE("garbage after the end") {
    read_all(write("garbage.gz", z + "not gzip"), &error);
    CHECK(error == "garbage after the end of the gzip stream");
    gunzip_all(z + "x", &error);
    CHECK(error == "garbage after the end of the gzip stream");
  }
  SUBCASE("a missing file") {
    MaybeGzipFile f;
    CHECK_FALSE(f.open(path_of("none.gz"), &error));
    CHECK(error.find("none.gz: cannot open: No such file or directory") != std::string::npos);
  }
}

TEST_CASE("getline: lines across chunks and members, the last without a newline, and a bound") {
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "line " + std::to_string(i) + "\n";
  text += "last";
  const std::string half = text.substr(0, text.size() / 2), rest = text.substr(text.size() / 2);
  for (const std::string& bytes : {gzip(half) + gzip(rest), text}) {
    MaybeGzipFile f;
    std::string error;
    REQUIRE(f.open(write("lines", bytes), &error));
    std::string line;
    int n = 0;
    std::string last;
    while (f.getline(&line, 100)) {
      if (n < 20000) CHECK(line == "line " + std::to_string(n));
      last = line;
      ++n;
    }
    CHECK_FALSE(f.failed());
    CHECK(n == 20001);
    CHECK(last == "last");
  }
  MaybeGzipFile f;
  std::string error, line;
  REQUIRE(f.open(write("long", gzip(std::string(5000, 'y') + "\n")), &error));
  CHECK_FALSE(f.getline(&line, 4096));
  CHECK(f.error() == "line longer than 4096 bytes");
}
