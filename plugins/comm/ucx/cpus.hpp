// How many CPUs a host's ranks may run on together: the union of their
// affinity masks. A rank bound to one CPU, beside others bound to theirs,
// is not oversubscribed; its own mask alone would say it is.
#pragma once

#include <sys/types.h>

#include <vector>

namespace ballast::comm {

// The number of CPUs in the union of the affinity masks of `pids` (0: this
// process). A process whose mask cannot be read (gone, not permitted)
// counts as this process's mask. At least 1.
int cpus_of(const std::vector<pid_t>& pids);

}  // namespace ballast::comm
