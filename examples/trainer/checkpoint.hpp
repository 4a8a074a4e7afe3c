// Checkpoints as safetensors: the model's tensors, Adam's moments
// ("adam.m.<tensor>", "adam.v.<tensor>") and, in __metadata__, what a resume
// needs to continue bit for bit (docs/job-channel.md, "Checkpoints").
#pragma once

#include "model.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

// What a checkpoint records beside the tensors.
struct CheckpointMeta {
  uint64_t step = 0;  // the weights are those after this step
  uint64_t seed = 0;
  int world_size = 1;
  int batch = 0;
  float lr = 0;
  Shape shape;
  std::string vocab;  // the corpus's distinct bytes
};

struct Written {
  std::string path;
  uint64_t bytes = 0;
};

// Writes dir/step-NNNNNNNN.safetensors atomically: a temporary file in dir,
// fsync, rename, fsync of dir. Throws std::runtime_error naming the file and
// the failing call; the temporary file is removed then.
Written write_checkpoint(const std::string& dir, const CheckpointMeta& meta, Model& model, Adam& adam);

// A safetensors file in memory, as the start-up plugin's loader hands it
// over: the whole file's bytes and where each tensor lies in them.
struct LoadedTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the start of the file
  uint64_t bytes = 0;
};
struct LoadedFile {
  std::string path;
  const unsigned char* data = nullptr;
  uint64_t size = 0;
  std::vector<LoadedTensor> tensors;
};

// The metadata of a loaded checkpoint; throws naming the file and the field
// when it is not one of this trainer's.
CheckpointMeta read_meta(const LoadedFile& file);

// Copies the checkpoint's tensors into the model and the optimiser, whose
// shapes must be the checkpoint's; throws naming the file and the tensor.
void read_tensors(const LoadedFile& file, Model& model, Adam& adam);

}  // namespace trainer
