// The checkpoints of a job: BALLAST_CHECKPOINT_DIR/step-NNNNNNNN.safetensors,
// complete once under that name (docs/job-channel.md).
#pragma once

#include <cstdint>
#include <string>

namespace ballast::runner {

struct Checkpoint {
  std::string path;  // "" when none
  int64_t step = 0;  // 0: start fresh from the seed
};

// The newest checkpoint in dir whose step is at most max_step (any when
// max_step < 0); {"" , 0} when there is none.
Checkpoint find_checkpoint(const std::string& dir, int64_t max_step);

}  // namespace ballast::runner
