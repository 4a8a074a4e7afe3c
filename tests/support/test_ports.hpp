// TCP ports for the servers a test starts (controllers, etcd, Slurm,
// Prometheus, a rank 0's bootstrap).
#pragma once

namespace test {

// The first of `count` consecutive ports (at most 1,024), free on every
// local address now, that no other call or test process is given while
// this process lives; -1 when none could be had. They lie below 10000: under the
// range the kernel takes connections' source ports and bind(0)'s ports
// from (ip_local_port_range, 32768 and up here), so no client connection
// can take one before its server binds it, and under the range a job's
// MASTER_PORT is picked from (10000 and up, plugins/common/launch_env), so
// a job a test starts cannot take one either. Tests running at once are
// kept apart by lock files in /tmp/ballast-test-ports, held until exit.
// Ports are used again soon after another test process ended: a server on
// one must set SO_REUSEADDR (connections of the last user in TIME_WAIT).
int reserve_ports(int count);

}  // namespace test
