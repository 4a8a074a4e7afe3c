// Failure messages of a comm plugin go to its host (plugin.h, "Errors"), so
// that a caller reads them with its own host's last_error, as for every
// interface. The plugin's own last_error(state) of ballast.comm v1 keeps the
// same text.
#pragma once

#include <ballast/plugin.h>

#include <string>

namespace ballast::comm {

// The host of this plugin: set by create, forgotten by destroy (only when it
// is still that one: two hosts may have loaded the same plugin file).
void set_error_host(const ballast_host_api* host);
void forget_error_host(const ballast_host_api* host);
// Hand a failure's message to the host, when there is one. Any thread.
void report_error(const std::string& message);

}  // namespace ballast::comm
