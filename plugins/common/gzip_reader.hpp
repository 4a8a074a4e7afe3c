// Reading gzip files (zlib): one or more members, as `gzip -c a b > c`
// writes them, with errors that say what is wrong with the stream. Used by
// the readers of metrics (`ballast detect`) and of straggler traces.
#pragma once

#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>

namespace ballast::util {

// Whether data starts with gzip's magic bytes.
bool is_gzip(const void* data, size_t size);

// Decompresses gzip data, handed over in pieces (feed) or all at once.
// Not thread-safe; one stream per object.
class Gunzip {
 public:
  Gunzip();
  ~Gunzip();
  Gunzip(const Gunzip&) = delete;
  Gunzip& operator=(const Gunzip&) = delete;

  // The next compressed bytes; the caller keeps them until needs_input().
  // last: no more input follows (the stream must end inside it).
  void feed(const void* data, size_t size, bool last);
  bool needs_input() const;

  // Decompresses up to cap bytes into out; returns how many. 0 with
  // needs_input() asks for more input; 0 otherwise means the end (done())
  // or an error (failed(), error() says what: a truncated or corrupt
  // stream, garbage after its end).
  size_t read(char* out, size_t cap);
  bool done() const { return state_ == State::done; }
  bool failed() const { return state_ == State::failed; }
  const std::string& error() const { return error_; }

 private:
  enum class State { running, done, failed };
  struct Stream;
  std::unique_ptr<Stream> z_;
  State state_ = State::running;
  bool last_ = false;
  bool between_members_ = false;  // the last member ended; nothing of another read yet
  std::string error_;
};

// A file read in chunks, decompressed when it starts with gzip's magic
// bytes, else as it is.
class MaybeGzipFile {
 public:
  // False with *error ("PATH: cannot open: ...") when it cannot be opened.
  bool open(const std::string& path, std::string* error);
  // Up to cap bytes into out; 0 at the end or on an error (failed(), error()
  // without the path: "truncated gzip stream: ...", "cannot read: ...").
  size_t read(char* out, size_t cap);
  // The next line, without its '\n' (the last may lack one); false at the
  // end or on an error, a line longer than max_line included. Use either
  // read() or getline() on one file, not both.
  bool getline(std::string* line, size_t max_line);
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  bool compressed() const { return gz_ != nullptr; }

 private:
  bool fill();
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_{nullptr, &std::fclose};
  std::unique_ptr<Gunzip> gz_;
  std::unique_ptr<char[]> in_;
  size_t in_size_ = 0, in_pos_ = 0;
  std::unique_ptr<char[]> lines_;  // what getline() read and has not returned yet
  size_t lines_size_ = 0, lines_pos_ = 0;
  bool eof_ = false;
  std::string error_;
};

}  // namespace ballast::util
