#include "progress.hpp"

#include <unistd.h>

#include <cmath>

namespace ballast::util {

namespace {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string size_text(double v, bool bytes) {
  if (!bytes) return fixed(v, 0);
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return fixed(v, u == 0 ? 0 : 1) + " " + units[u];
}

std::string duration_text(double s) {
  if (s < 60) return fixed(std::ceil(s), 0) + " s";
  if (s < 3600) return fixed(std::floor(s / 60), 0) + " min " + fixed(std::fmod(std::ceil(s), 60), 0) + " s";
  return fixed(std::floor(s / 3600), 0) + " h " + fixed(std::fmod(std::floor(s / 60), 60), 0) + " min";
}

}  // namespace

std::string progress_text(const std::string& label, double done, double total, double seconds, bool bytes) {
  std::string t = label + ": " + size_text(done, bytes);
  if (total > 0) t += " of " + size_text(total, bytes) + " (" + fixed(std::floor(100 * done / total), 0) + "%)";
  if (seconds > 0 && done > 0) {
    const double rate = done / seconds;
    t += ", " + (bytes ? fixed(rate / 1e6, rate < 1e7 ? 1 : 0) + " MB/s" : fixed(rate, rate < 10 ? 1 : 0) + "/s");
    if (total > done) t += ", " + duration_text((total - done) / rate) + " left";
  }
  return t;
}

ProgressLine::ProgressLine(std::FILE* out, std::string label, bool bytes, bool quiet)
    : out_(out),
      label_(std::move(label)),
      bytes_(bytes),
      active_(!quiet && out != nullptr && isatty(fileno(out)) == 1),
      start_(std::chrono::steady_clock::now()) {}

void ProgressLine::update(double done, double total) {
  if (!active_) return;
  const auto now = std::chrono::steady_clock::now();
  if (shown_ > 0 && now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  draw(progress_text(label_, done, total, std::chrono::duration<double>(now - start_).count(), bytes_));
}

void ProgressLine::status(const std::string& text) {
  if (!active_) return;
  const auto now = std::chrono::steady_clock::now();
  if (shown_ > 0 && now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  draw(label_ + ": " + text);
}

void ProgressLine::draw(const std::string& text) {
  // Overwrites the previous line; spaces cover what a shorter one leaves.
  std::string line = "\r" + text;
  if (text.size() < shown_) line += std::string(shown_ - text.size(), ' ') + "\r" + text;
  std::fputs(line.c_str(), out_);
  std::fflush(out_);
  shown_ = text.size();
}

void ProgressLine::clear() {
  if (!active_ || shown_ == 0) return;
  std::fputs(("\r" + std::string(shown_, ' ') + "\r").c_str(), out_);
  std::fflush(out_);
  shown_ = 0;
}

}  // namespace ballast::util
