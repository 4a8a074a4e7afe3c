// `ballast analyze` and `ballast launch`.
#pragma once

namespace ballast::hang {

// ballast analyze DIR [--json] [--chrome FILE] [--slow-ms N]
// Exit 0 when healthy, 1 when the verdict is hang, mismatch or slow, 2 on bad usage or input.
int analyze_main(int argc, char** argv);

// ballast launch -n N [--trace-dir DIR] [--stall SECONDS] [--json] -- CMD ARGS...
// Exit 0 when every rank exited 0; 1 when a rank failed or the job hung; 128 + the signal when
// SIGINT, SIGTERM or SIGHUP stopped it (the ranks are stopped first).
int launch_main(int argc, char** argv);

}  // namespace ballast::hang
