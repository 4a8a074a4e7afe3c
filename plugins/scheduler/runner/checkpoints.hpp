// The checkpoints of a job: BALLAST_CHECKPOINT_DIR/step-NNNNNNNN.safetensors,
// complete once under that name (docs/job-channel.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ballast::runner {

struct Checkpoint {
  std::string path;  // "" when none
  int64_t step = 0;  // 0: start fresh from the seed
};

// Every checkpoint in dir, oldest first.
std::vector<Checkpoint> list_checkpoints(const std::string& dir);

// The newest checkpoint in dir whose step is at most max_step (any when
// max_step < 0); {"" , 0} when there is none.
Checkpoint find_checkpoint(const std::string& dir, int64_t max_step);

// Deletes all but the newest `keep` checkpoints (none when keep <= 0),
// except the newest one before step `protect_before` (when > 0: the one a
// rollback past a NaN needs). Returns what it deleted.
std::vector<Checkpoint> prune_checkpoints(const std::string& dir, int keep, int64_t protect_before);

}  // namespace ballast::runner
