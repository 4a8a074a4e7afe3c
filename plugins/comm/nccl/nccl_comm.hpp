// Communicators over NCCL and CUDA behind the ballast.comm v1 table.
#pragma once

#include <ballast/comm.h>

namespace ballast::comm_nccl {

const char* last_error();
// The table; every function follows comm.h. Buffers are device memory.
const ballast_comm_api* api();

}  // namespace ballast::comm_nccl
