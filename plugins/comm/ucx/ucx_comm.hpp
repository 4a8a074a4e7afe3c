// Communicators over UCX: the world (one UCX context, worker and endpoint
// per peer, shared by a world communicator and its splits), communicators,
// and the engine that runs an operation as a list of steps of chunked tag
// transfers under a deadline.
#pragma once

#include <ballast/comm.h>
#include <ballast/trace.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ballast::comm {

struct World;
struct Comm;

// Failure messages of this thread's last failing call ("" after success).
const char* last_error();
int set_last_error(int status, const std::string& msg);

int comm_init(const ballast_comm_config* cfg, Comm** out);
int comm_split(Comm* parent, int32_t colour, int32_t key, Comm** out);
void comm_destroy(Comm* comm);
int comm_abort(Comm* comm, const char* reason);
int comm_info(Comm* comm, ballast_comm_info* info);
int comm_start(Comm* comm, const ballast_comm_args* args, ballast_comm_request** req);
int comm_test(ballast_comm_request* req, int* done);
int comm_wait(ballast_comm_request* req);
int comm_run(Comm* comm, const ballast_comm_args* args);

}  // namespace ballast::comm
