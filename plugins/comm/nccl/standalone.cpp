// ballast-nccl-profiler.so: the profiler part of comm-nccl on its own, as an
// NCCL profiler plugin (NCCL_PROFILER_PLUGIN=/path/ballast-nccl-profiler.so)
// for any NCCL job: it records the operations of every communicator of the
// process (a framework's own, such as PyTorch's ProcessGroupNCCL) into the
// trace rings that `ballast analyze` and the hang detector read.
#include "nccl_profiler.hpp"

namespace {

const bool kEvery = (ballast::comm_nccl::trace_every_communicator(true), true);

}  // namespace
