#include "corpus.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <system_error>

namespace fs = std::filesystem;

namespace trainer {

namespace {

void append_file(const fs::path& file, uint64_t max_bytes, std::string* text) {
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (ec) throw std::runtime_error("data: " + file.string() + ": " + ec.message());
  if (text->size() + size > max_bytes)
    throw std::runtime_error("data: " + file.string() + ": the text would exceed --max-data-bytes (" +
                             std::to_string(max_bytes) + " bytes)");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("data: " + file.string() + ": cannot be opened");
  text->append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("data: " + file.string() + ": read error");
}

}  // namespace

uint64_t mix(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a ^ (b * 0x9e3779b97f4a7c15ULL) ^ (c * 0xc2b2ae3d27d4eb4fULL);
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Corpus::Corpus(const std::string& path, int context, uint64_t max_bytes) : context_(context) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw std::runtime_error("data: " + path + ": " + (ec ? ec.message() : "no such file or directory"));
  std::string text;
  if (fs::is_directory(st)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (!e.is_symlink() && e.is_regular_file()) files.push_back(e.path());
    if (ec) throw std::runtime_error("data: " + path + ": " + ec.message());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) append_file(f, max_bytes, &text);
  } else {
    append_file(path, max_bytes, &text);
  }
  if (text.size() < uint64_t(context) + 1)
    throw std::runtime_error("data: " + path + ": " + std::to_string(text.size()) + " bytes, fewer than the " +
                             std::to_string(context + 1) + " one training window needs");
  std::array<int32_t, 256> index{};
  index.fill(-1);
  for (unsigned char c : text) index[c] = 0;
  for (int b = 0; b < 256; ++b)
    if (index[b] == 0) {
      index[b] = int32_t(vocab_.size());
      vocab_.push_back(char(b));
    }
  tokens_.reserve(text.size());
  for (unsigned char c : text) tokens_.push_back(index[c]);
}

void Corpus::batch(uint64_t seed, uint64_t step, int rank, int batch, std::vector<int32_t>* inputs,
                   std::vector<int32_t>* targets) const {
  std::mt19937_64 rng(mix(seed, step, uint64_t(rank) + 1));
  const uint64_t windows = tokens_.size() - uint64_t(context_);
  inputs->resize(size_t(batch) * size_t(context_));
  targets->resize(size_t(batch));
  for (int b = 0; b < batch; ++b) {
    const uint64_t at = rng() % windows;  // the modulo's bias is irrelevant here; what matters is that it is exact
    std::copy_n(tokens_.begin() + int64_t(at), context_, inputs->begin() + int64_t(b) * context_);
    (*targets)[size_t(b)] = tokens_[at + uint64_t(context_)];
  }
}

}  // namespace trainer
