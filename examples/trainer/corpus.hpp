// The training text: the bytes of one file or of every regular file in a
// folder (sorted by name; symbolic links skipped, so that a licence linked
// under two names counts once), its vocabulary, and the batches drawn from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

class Corpus {
 public:
  // Reads `path`; throws std::runtime_error naming the path when it cannot be
  // read, holds no text, is shorter than context + 1 bytes or larger than
  // max_bytes.
  Corpus(const std::string& path, int context, uint64_t max_bytes);

  int vocab_size() const { return int(vocab_.size()); }
  const std::string& vocab() const { return vocab_; }  // the distinct bytes, in byte order
  uint64_t size() const { return tokens_.size(); }

  // Batch of step `step` on rank `rank`: `batch` windows of `context` tokens
  // (row-major in *inputs) and the token after each (*targets), at positions
  // drawn from (seed, step, rank) alone, so that a resumed run draws what an
  // uninterrupted one would.
  void batch(uint64_t seed, uint64_t step, int rank, int batch, std::vector<int32_t>* inputs,
             std::vector<int32_t>* targets) const;

 private:
  int context_;
  std::string vocab_;
  std::vector<int32_t> tokens_;  // index into vocab_ of each byte
};

// A 64-bit mix of a few numbers (splitmix64), for seeding generators.
uint64_t mix(uint64_t a, uint64_t b = 0, uint64_t c = 0);

}  // namespace trainer
