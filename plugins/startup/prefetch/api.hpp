// The "ballast.startup" v1 table (abi/ballast/startup.h) over the loader and
// the stage log.
#pragma once

#include <ballast/startup.h>

namespace ballast::startup {

// State behind the table; host may be NULL (no events, stage log only).
struct ApiState {
  const ballast_host_api* host = nullptr;
};

const ballast_startup_api* startup_api();

}  // namespace ballast::startup
