#include "gzip_reader.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ballast::util {

namespace {
constexpr size_t kChunk = 1 << 16;
}

bool is_gzip(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  return size >= 2 && p[0] == 0x1f && p[1] == 0x8b;
}

struct Gunzip::Stream {
  z_stream zs{};
  bool open = false;
  ~Stream() {
    if (open) inflateEnd(&zs);
  }
};

Gunzip::Gunzip() : z_(std::make_unique<Stream>()) {
  // 15 + 32: the largest window, gzip or zlib header detected.
  if (inflateInit2(&z_->zs, 15 + 32) != Z_OK) {
    state_ = State::failed;
    error_ = "zlib initialisation failed";
    return;
  }
  z_->open = true;
}

Gunzip::~Gunzip() = default;

void Gunzip::feed(const void* data, size_t size, bool last) {
  z_->zs.next_in = static_cast<Bytef*>(const_cast<void*>(data));  // zlib does not write it
  z_->zs.avail_in = static_cast<uInt>(size);
  last_ = last;
}

bool Gunzip::needs_input() const { return state_ == State::running && z_->zs.avail_in == 0 && !last_; }

size_t Gunzip::read(char* out, size_t cap) {
  size_t produced = 0;
  z_stream& zs = z_->zs;
  while (state_ == State::running && produced < cap) {
    if (zs.avail_in == 0) {
      if (!last_) break;  // needs input
      if (between_members_) {
        state_ = State::done;
      } else {
        state_ = State::failed;
        error_ = "truncated gzip stream: the file ends inside the compressed data";
      }
      break;
    }
    // After a member only another member may follow: its magic bytes, as far
    // as this input shows them.
    if (between_members_ && (zs.next_in[0] != 0x1f || (zs.avail_in >= 2 && zs.next_in[1] != 0x8b))) {
      state_ = State::failed;
      error_ = "garbage after the end of the gzip stream";
      break;
    }
    zs.next_out = reinterpret_cast<Bytef*>(out + produced);
    zs.avail_out = static_cast<uInt>(std::min<size_t>(cap - produced, 1u << 30));
    const uInt in_before = zs.avail_in, out_before = zs.avail_out;
    const int rc = inflate(&zs, Z_NO_FLUSH);
    produced += out_before - zs.avail_out;
    const bool progress = zs.avail_in != in_before || zs.avail_out != out_before;
    if (rc == Z_STREAM_END) {
      // Another member may follow (gzip -c a b > c): one stream.
      inflateReset(&zs);
      between_members_ = true;
      continue;
    }
    if ((rc == Z_OK || rc == Z_BUF_ERROR) && progress) {
      between_members_ = false;
      continue;
    }
    state_ = State::failed;
    if (between_members_)
      error_ = "garbage after the end of the gzip stream";
    else
      error_ = std::string("corrupt gzip stream: ") + (zs.msg ? zs.msg : "zlib error " + std::to_string(rc));
  }
  return produced;
}

bool MaybeGzipFile::open(const std::string& path, std::string* error) {
  file_.reset(std::fopen(path.c_str(), "rb"));
  if (!file_) {
    *error = path + ": cannot open: " + std::strerror(errno);
    return false;
  }
  in_ = std::make_unique<char[]>(kChunk);
  if (!fill()) {
    *error = path + ": " + error_;
    return false;
  }
  if (is_gzip(in_.get(), in_size_)) {
    gz_ = std::make_unique<Gunzip>();
    gz_->feed(in_.get(), in_size_, eof_);
  }
  return true;
}

bool MaybeGzipFile::fill() {
  in_size_ = std::fread(in_.get(), 1, kChunk, file_.get());
  in_pos_ = 0;
  if (in_size_ < kChunk) {
    if (std::ferror(file_.get())) {
      error_ = std::string("cannot read: ") + std::strerror(errno);
      return false;
    }
    eof_ = true;
  }
  return true;
}

size_t MaybeGzipFile::read(char* out, size_t cap) {
  if (failed()) return 0;
  if (!gz_) {
    size_t n = 0;
    while (n < cap) {
      if (in_pos_ == in_size_) {
        if (eof_ || !fill() || in_size_ == 0) break;
      }
      const size_t take = std::min(cap - n, in_size_ - in_pos_);
      std::memcpy(out + n, in_.get() + in_pos_, take);
      n += take;
      in_pos_ += take;
    }
    return n;
  }
  for (;;) {
    const size_t n = gz_->read(out, cap);
    if (n > 0) return n;
    if (gz_->failed()) {
      error_ = gz_->error();
      return 0;
    }
    if (!gz_->needs_input()) return 0;
    if (!fill()) return 0;
    gz_->feed(in_.get(), in_size_, eof_);
  }
}

bool MaybeGzipFile::getline(std::string* line, size_t max_line) {
  line->clear();
  if (!lines_) lines_ = std::make_unique<char[]>(kChunk);
  for (;;) {
    if (lines_pos_ == lines_size_) {
      lines_size_ = read(lines_.get(), kChunk);
      lines_pos_ = 0;
      if (lines_size_ == 0) return !line->empty() && !failed();
    }
    const char* begin = lines_.get() + lines_pos_;
    const char* end = lines_.get() + lines_size_;
    const char* nl = static_cast<const char*>(std::memchr(begin, '\n', size_t(end - begin)));
    const char* stop = nl ? nl : end;
    if (line->size() + size_t(stop - begin) > max_line) {
      error_ = "line longer than " + std::to_string(max_line) + " bytes";
      return false;
    }
    line->append(begin, stop);
    lines_pos_ = size_t(stop - lines_.get()) + (nl ? 1 : 0);
    if (nl) return true;
  }
}

}  // namespace ballast::util
