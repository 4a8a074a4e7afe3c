// A progress line for long work on a terminal: redrawn in place ("\r", at
// most 5 times a second) and erased when done, e.g.
//   ballast startup prefetch: 1.2 GiB of 4.0 GiB (30%), 850 MB/s, 3 s left
// Silent when the stream is not a terminal or when the command prints JSON:
// logs and pipes never get the line.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace ballast::util {

// The text of one line: DONE of TOTAL (PERCENT), RATE, TIME left. bytes:
// sizes in B/KiB/MiB/GiB and rates in MB/s; else plain counts and "/s".
// total <= 0: no fraction and no time left.
std::string progress_text(const std::string& label, double done, double total, double seconds, bool bytes);

class ProgressLine {
 public:
  // quiet: never draw (--json). The line shows when out is a terminal.
  ProgressLine(std::FILE* out, std::string label, bool bytes, bool quiet);
  ~ProgressLine() { clear(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool active() const { return active_; }
  // Redraws with done of total (total <= 0: unknown), unless the last
  // redraw was less than 200 ms ago. Main thread only.
  void update(double done, double total);
  // Redraws with free text after the label (work without an end).
  void status(const std::string& text);
  // Erases the line (before other output, and at the end).
  void clear();

 private:
  void draw(const std::string& text);
  std::FILE* out_;
  std::string label_;
  bool bytes_, active_;
  size_t shown_ = 0;  // characters on the line now
  std::chrono::steady_clock::time_point start_, last_{};
};

}  // namespace ballast::util
