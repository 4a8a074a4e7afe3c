// Launching local ranks the way torchrun does: the environment each rank
// gets, and a MASTER_PORT that no other connection takes first.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ballast::launch {

// A MASTER_PORT for a job: free now on the loopback, and outside the range
// the kernel takes ports from for connections and bind(0)
// (ip_local_port_range), so that no connection of another process takes it
// as its source port before rank 0 listens on it. 0 when none was found.
int free_port();

// The job's bootstrap secret (BALLAST_BOOTSTRAP_SECRET): the one already in
// the environment (a job across hosts shares one), else 32 random bytes in
// hex. Empty when the kernel gave no random bytes (errno says why).
std::string bootstrap_secret();

// Where a rank sits in a job, as torchrun numbers it.
struct RankPlace {
  int rank = 0;         // RANK
  int world = 1;        // WORLD_SIZE
  int local_rank = 0;   // LOCAL_RANK
  int local_world = 1;  // LOCAL_WORLD_SIZE
  int group_rank = 0;   // GROUP_RANK: the node's index
};

// torchrun's variables for one rank: RANK, LOCAL_RANK, GROUP_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR (the loopback), MASTER_PORT.
std::vector<std::pair<std::string, std::string>> torchrun_env(const RankPlace& place, int master_port);

}  // namespace ballast::launch
