// ABI v1.0 frozen: the size and every field offset of every struct and table
// of abi/ballast/ as released in 1.0 (x86-64 and aarch64 Linux, LP64), and
// the v1 minimum size of each sized one (status.h, "Sizes"). A field inserted
// mid-struct, a type widened or a v1 minimum moved fails here; a field
// appended at the end changes only the sizeof line, which is then updated.
#include <ballast/ballast.h>

#include <doctest/doctest.h>

#include <cstddef>

#define FIELD(S, F, OFFSET) CHECK(offsetof(S, F) == OFFSET)

TEST_CASE("v1.0 layout of ballast_comm_config") {
  CHECK(sizeof(ballast_comm_config) == 56);
  FIELD(ballast_comm_config, size, 0);
  FIELD(ballast_comm_config, flags, 4);
  FIELD(ballast_comm_config, rank, 8);
  FIELD(ballast_comm_config, nranks, 12);
  FIELD(ballast_comm_config, master_addr, 16);
  FIELD(ballast_comm_config, master_port, 24);
  FIELD(ballast_comm_config, reserved, 28);
  FIELD(ballast_comm_config, timeout_ns, 32);
  FIELD(ballast_comm_config, init_timeout_ns, 40);
  FIELD(ballast_comm_config, trace_dir, 48);
}

TEST_CASE("v1.0 layout of ballast_comm_args") {
  CHECK(sizeof(ballast_comm_args) == 64);
  FIELD(ballast_comm_args, size, 0);
  FIELD(ballast_comm_args, op, 4);
  FIELD(ballast_comm_args, dtype, 8);
  FIELD(ballast_comm_args, redop, 12);
  FIELD(ballast_comm_args, sendbuf, 16);
  FIELD(ballast_comm_args, recvbuf, 24);
  FIELD(ballast_comm_args, count, 32);
  FIELD(ballast_comm_args, root, 40);
  FIELD(ballast_comm_args, reserved, 44);
  FIELD(ballast_comm_args, timeout_ns, 48);
  FIELD(ballast_comm_args, stream, 56);
}

TEST_CASE("v1.0 layout of ballast_comm_info") {
  CHECK(sizeof(ballast_comm_info) == 40);
  FIELD(ballast_comm_info, size, 0);
  FIELD(ballast_comm_info, rank, 4);
  FIELD(ballast_comm_info, nranks, 8);
  FIELD(ballast_comm_info, world_rank, 12);
  FIELD(ballast_comm_info, comm_id, 16);
  FIELD(ballast_comm_info, seq, 24);
  FIELD(ballast_comm_info, max_in_flight, 32);
  FIELD(ballast_comm_info, reserved, 36);
}

TEST_CASE("v1.0 layout of ballast_comm_api") {
  CHECK(sizeof(ballast_comm_api) == 88);
  FIELD(ballast_comm_api, size, 0);
  FIELD(ballast_comm_api, reserved, 4);
  FIELD(ballast_comm_api, init, 8);
  FIELD(ballast_comm_api, split, 16);
  FIELD(ballast_comm_api, destroy, 24);
  FIELD(ballast_comm_api, abort, 32);
  FIELD(ballast_comm_api, info, 40);
  FIELD(ballast_comm_api, start, 48);
  FIELD(ballast_comm_api, test, 56);
  FIELD(ballast_comm_api, wait, 64);
  FIELD(ballast_comm_api, run, 72);
  FIELD(ballast_comm_api, last_error, 80);
}

TEST_CASE("v1.0 layout of ballast_command") {
  CHECK(sizeof(ballast_command) == 24);
  FIELD(ballast_command, name, 0);
  FIELD(ballast_command, summary, 8);
  FIELD(ballast_command, run, 16);
}

TEST_CASE("v1.0 layout of ballast_command_table") {
  CHECK(sizeof(ballast_command_table) == 16);
  FIELD(ballast_command_table, size, 0);
  FIELD(ballast_command_table, count, 4);
  FIELD(ballast_command_table, commands, 8);
}

TEST_CASE("v1.0 layout of ballast_source") {
  CHECK(sizeof(ballast_source) == 24);
  FIELD(ballast_source, node, 0);
  FIELD(ballast_source, rank, 8);
  FIELD(ballast_source, plugin, 16);
}

TEST_CASE("v1.0 layout of ballast_event") {
  CHECK(sizeof(ballast_event) == 64);
  FIELD(ballast_event, size, 0);
  FIELD(ballast_event, schema, 4);
  FIELD(ballast_event, topic, 8);
  FIELD(ballast_event, ts_ns, 16);
  FIELD(ballast_event, source, 24);
  FIELD(ballast_event, payload, 48);
  FIELD(ballast_event, payload_size, 56);
}

TEST_CASE("v1.0 layout of ballast_subscribe_options") {
  CHECK(sizeof(ballast_subscribe_options) == 16);
  FIELD(ballast_subscribe_options, size, 0);
  FIELD(ballast_subscribe_options, delivery, 4);
  FIELD(ballast_subscribe_options, flags, 8);
  FIELD(ballast_subscribe_options, queue_capacity, 12);
}

TEST_CASE("v1.0 layout of ballast_metric_sample") {
  CHECK(sizeof(ballast_metric_sample) == 40);
  FIELD(ballast_metric_sample, node, 0);
  FIELD(ballast_metric_sample, metric, 8);
  FIELD(ballast_metric_sample, ts_ns, 16);
  FIELD(ballast_metric_sample, value, 24);
  FIELD(ballast_metric_sample, flags, 32);
}

TEST_CASE("v1.0 layout of ballast_metric_batch") {
  CHECK(sizeof(ballast_metric_batch) == 16);
  FIELD(ballast_metric_batch, size, 0);
  FIELD(ballast_metric_batch, count, 4);
  FIELD(ballast_metric_batch, samples, 8);
}

TEST_CASE("v1.0 layout of ballast_op_timing") {
  CHECK(sizeof(ballast_op_timing) == 64);
  FIELD(ballast_op_timing, dp_rank, 0);
  FIELD(ballast_op_timing, stage, 4);
  FIELD(ballast_op_timing, rank, 8);
  FIELD(ballast_op_timing, step, 16);
  FIELD(ballast_op_timing, optype, 24);
  FIELD(ballast_op_timing, start_s, 32);
  FIELD(ballast_op_timing, duration_s, 40);
  FIELD(ballast_op_timing, seq_id, 48);
  FIELD(ballast_op_timing, mc, 52);
  FIELD(ballast_op_timing, mb_id, 56);
  FIELD(ballast_op_timing, gmc, 60);
}

TEST_CASE("v1.0 layout of ballast_op_timing_batch") {
  CHECK(sizeof(ballast_op_timing_batch) == 16);
  FIELD(ballast_op_timing_batch, size, 0);
  FIELD(ballast_op_timing_batch, count, 4);
  FIELD(ballast_op_timing_batch, ops, 8);
}

TEST_CASE("v1.0 layout of ballast_collective_record") {
  CHECK(sizeof(ballast_collective_record) == 136);
  FIELD(ballast_collective_record, size, 0);
  FIELD(ballast_collective_record, state, 4);
  FIELD(ballast_collective_record, comm_id, 8);
  FIELD(ballast_collective_record, seq, 16);
  FIELD(ballast_collective_record, op, 24);
  FIELD(ballast_collective_record, dtype, 32);
  FIELD(ballast_collective_record, algorithm, 40);
  FIELD(ballast_collective_record, count, 48);
  FIELD(ballast_collective_record, bytes, 56);
  FIELD(ballast_collective_record, rank, 64);
  FIELD(ballast_collective_record, nranks, 68);
  FIELD(ballast_collective_record, peer, 72);
  FIELD(ballast_collective_record, status, 76);
  FIELD(ballast_collective_record, issue_ns, 80);
  FIELD(ballast_collective_record, start_ns, 88);
  FIELD(ballast_collective_record, end_ns, 96);
  FIELD(ballast_collective_record, chunks_posted, 104);
  FIELD(ballast_collective_record, chunks_sent, 112);
  FIELD(ballast_collective_record, chunks_received, 120);
  FIELD(ballast_collective_record, chunks_reduced, 128);
}

TEST_CASE("v1.0 layout of ballast_fault_report") {
  CHECK(sizeof(ballast_fault_report) == 88);
  FIELD(ballast_fault_report, size, 0);
  FIELD(ballast_fault_report, stage, 4);
  FIELD(ballast_fault_report, subject, 8);
  FIELD(ballast_fault_report, rank, 16);
  FIELD(ballast_fault_report, kind, 24);
  FIELD(ballast_fault_report, metric, 32);
  FIELD(ballast_fault_report, score, 40);
  FIELD(ballast_fault_report, confidence, 48);
  FIELD(ballast_fault_report, since_ns, 56);
  FIELD(ballast_fault_report, detected_ns, 64);
  FIELD(ballast_fault_report, evidence, 72);
  FIELD(ballast_fault_report, detector, 80);
}

TEST_CASE("v1.0 layout of ballast_placement_node") {
  CHECK(sizeof(ballast_placement_node) == 24);
  FIELD(ballast_placement_node, name, 0);
  FIELD(ballast_placement_node, pp_stage, 8);
  FIELD(ballast_placement_node, dp_row, 12);
  FIELD(ballast_placement_node, first_rank, 16);
}

TEST_CASE("v1.0 layout of ballast_placement_plan") {
  CHECK(sizeof(ballast_placement_plan) == 56);
  FIELD(ballast_placement_plan, size, 0);
  FIELD(ballast_placement_plan, count, 4);
  FIELD(ballast_placement_plan, job, 8);
  FIELD(ballast_placement_plan, algorithm, 16);
  FIELD(ballast_placement_plan, nodes, 24);
  FIELD(ballast_placement_plan, max_dp_spread, 32);
  FIELD(ballast_placement_plan, max_pp_spread, 36);
  FIELD(ballast_placement_plan, objective, 40);
  FIELD(ballast_placement_plan, lower_bound, 48);
}

TEST_CASE("v1.0 layout of ballast_recovery_action") {
  CHECK(sizeof(ballast_recovery_action) == 56);
  FIELD(ballast_recovery_action, size, 0);
  FIELD(ballast_recovery_action, reserved, 4);
  FIELD(ballast_recovery_action, action, 8);
  FIELD(ballast_recovery_action, subject, 16);
  FIELD(ballast_recovery_action, reason, 24);
  FIELD(ballast_recovery_action, args, 32);
  FIELD(ballast_recovery_action, policy, 40);
  FIELD(ballast_recovery_action, cause_topic, 48);
}

TEST_CASE("v1.0 layout of ballast_startup_stage") {
  CHECK(sizeof(ballast_startup_stage) == 56);
  FIELD(ballast_startup_stage, size, 0);
  FIELD(ballast_startup_stage, status, 4);
  FIELD(ballast_startup_stage, stage, 8);
  FIELD(ballast_startup_stage, node, 16);
  FIELD(ballast_startup_stage, rank, 24);
  FIELD(ballast_startup_stage, start_ns, 32);
  FIELD(ballast_startup_stage, end_ns, 40);
  FIELD(ballast_startup_stage, bytes, 48);
}

TEST_CASE("v1.0 layout of ballast_straggler_culprit") {
  CHECK(sizeof(ballast_straggler_culprit) == 24);
  FIELD(ballast_straggler_culprit, dimension, 0);
  FIELD(ballast_straggler_culprit, name, 8);
  FIELD(ballast_straggler_culprit, slowdown, 16);
}

TEST_CASE("v1.0 layout of ballast_straggler_report") {
  CHECK(sizeof(ballast_straggler_report) == 56);
  FIELD(ballast_straggler_report, size, 0);
  FIELD(ballast_straggler_report, count, 4);
  FIELD(ballast_straggler_report, slowdown, 8);
  FIELD(ballast_straggler_report, launch_slowdown, 16);
  FIELD(ballast_straggler_report, kind, 24);
  FIELD(ballast_straggler_report, culprits, 32);
  FIELD(ballast_straggler_report, first_step, 40);
  FIELD(ballast_straggler_report, last_step, 48);
}

TEST_CASE("v1.0 layout of ballast_host_api") {
  CHECK(sizeof(ballast_host_api) == 112);
  FIELD(ballast_host_api, size, 0);
  FIELD(ballast_host_api, abi_minor, 4);
  FIELD(ballast_host_api, publish, 8);
  FIELD(ballast_host_api, subscribe, 16);
  FIELD(ballast_host_api, unsubscribe, 24);
  FIELD(ballast_host_api, log, 32);
  FIELD(ballast_host_api, config_get, 40);
  FIELD(ballast_host_api, timer_start, 48);
  FIELD(ballast_host_api, timer_cancel, 56);
  FIELD(ballast_host_api, counter_add, 64);
  FIELD(ballast_host_api, now_ns, 72);
  FIELD(ballast_host_api, set_error, 80);
  FIELD(ballast_host_api, last_error, 88);
  FIELD(ballast_host_api, node_name, 96);      // 1.1, appended
  FIELD(ballast_host_api, fence_action, 104);  // 1.2, appended
}

TEST_CASE("v1.0 layout of ballast_interface_info") {
  CHECK(sizeof(ballast_interface_info) == 16);
  FIELD(ballast_interface_info, name, 0);
  FIELD(ballast_interface_info, version, 8);
}

TEST_CASE("v1.0 layout of ballast_plugin_descriptor") {
  CHECK(sizeof(ballast_plugin_descriptor) == 96);
  FIELD(ballast_plugin_descriptor, size, 0);
  FIELD(ballast_plugin_descriptor, abi_major, 4);
  FIELD(ballast_plugin_descriptor, abi_minor, 8);
  FIELD(ballast_plugin_descriptor, reserved, 12);
  FIELD(ballast_plugin_descriptor, name, 16);
  FIELD(ballast_plugin_descriptor, version, 24);
  FIELD(ballast_plugin_descriptor, kind, 32);
  FIELD(ballast_plugin_descriptor, description, 40);
  FIELD(ballast_plugin_descriptor, create, 48);
  FIELD(ballast_plugin_descriptor, start, 56);
  FIELD(ballast_plugin_descriptor, stop, 64);
  FIELD(ballast_plugin_descriptor, destroy, 72);
  FIELD(ballast_plugin_descriptor, get_interface, 80);
  FIELD(ballast_plugin_descriptor, interfaces, 88);
}

TEST_CASE("v1.0 layout of ballast_placement_request") {
  CHECK(sizeof(ballast_placement_request) == 48);
  FIELD(ballast_placement_request, size, 0);
  FIELD(ballast_placement_request, reserved, 4);
  FIELD(ballast_placement_request, topology_path, 8);
  FIELD(ballast_placement_request, job_json, 16);
  FIELD(ballast_placement_request, state_json, 24);
  FIELD(ballast_placement_request, algorithm, 32);
  FIELD(ballast_placement_request, seed, 40);
}

TEST_CASE("v1.0 layout of ballast_replacement_request") {
  CHECK(sizeof(ballast_replacement_request) == 48);
  FIELD(ballast_replacement_request, size, 0);
  FIELD(ballast_replacement_request, reserved, 4);
  FIELD(ballast_replacement_request, topology_path, 8);
  FIELD(ballast_replacement_request, state_json, 16);
  FIELD(ballast_replacement_request, plan_json, 24);
  FIELD(ballast_replacement_request, failed, 32);
  FIELD(ballast_replacement_request, spares, 40);
}

TEST_CASE("v1.0 layout of ballast_scheduler_api") {
  CHECK(sizeof(ballast_scheduler_api) == 40);
  FIELD(ballast_scheduler_api, size, 0);
  FIELD(ballast_scheduler_api, reserved, 4);
  FIELD(ballast_scheduler_api, place, 8);
  FIELD(ballast_scheduler_api, replace, 16);
  FIELD(ballast_scheduler_api, plan_json, 24);
  FIELD(ballast_scheduler_api, free_plan, 32);
}

TEST_CASE("v1.0 layout of ballast_startup_load_options") {
  CHECK(sizeof(ballast_startup_load_options) == 40);
  FIELD(ballast_startup_load_options, size, 0);
  FIELD(ballast_startup_load_options, stripes, 4);
  FIELD(ballast_startup_load_options, chunk_bytes, 8);
  FIELD(ballast_startup_load_options, flags, 16);
  FIELD(ballast_startup_load_options, reserved, 20);
  FIELD(ballast_startup_load_options, destination, 24);
  FIELD(ballast_startup_load_options, capacity, 32);
}

TEST_CASE("v1.0 layout of ballast_startup_tensor") {
  CHECK(sizeof(ballast_startup_tensor) == 48);
  FIELD(ballast_startup_tensor, name, 0);
  FIELD(ballast_startup_tensor, dtype, 8);
  FIELD(ballast_startup_tensor, ndim, 16);
  FIELD(ballast_startup_tensor, shape, 24);
  FIELD(ballast_startup_tensor, offset, 32);
  FIELD(ballast_startup_tensor, bytes, 40);
}

TEST_CASE("v1.0 layout of ballast_startup_api") {
  CHECK(sizeof(ballast_startup_api) == 72);
  FIELD(ballast_startup_api, size, 0);
  FIELD(ballast_startup_api, load, 8);
  FIELD(ballast_startup_api, data, 16);
  FIELD(ballast_startup_api, checksum, 24);
  FIELD(ballast_startup_api, tensor_count, 32);
  FIELD(ballast_startup_api, tensor, 40);
  FIELD(ballast_startup_api, release, 48);
  FIELD(ballast_startup_api, stage, 56);
  FIELD(ballast_startup_api, last_error, 64);
}

TEST_CASE("v1.0 layout of ballast_trace_header") {
  CHECK(sizeof(ballast_trace_header) == 256);
  FIELD(ballast_trace_header, magic, 0);
  FIELD(ballast_trace_header, version, 8);
  FIELD(ballast_trace_header, header_size, 12);
  FIELD(ballast_trace_header, slot_size, 16);
  FIELD(ballast_trace_header, slot_count, 20);
  FIELD(ballast_trace_header, pid, 24);
  FIELD(ballast_trace_header, rank, 28);
  FIELD(ballast_trace_header, nranks, 32);
  FIELD(ballast_trace_header, closed, 36);
  FIELD(ballast_trace_header, clock_wall_ns, 40);
  FIELD(ballast_trace_header, clock_tick, 48);
  FIELD(ballast_trace_header, ns_per_tick, 56);
  FIELD(ballast_trace_header, head, 64);
  FIELD(ballast_trace_header, heartbeat_tick, 72);
  FIELD(ballast_trace_header, host, 80);
  FIELD(ballast_trace_header, skipped, 144);
  FIELD(ballast_trace_header, dropped, 152);
  FIELD(ballast_trace_header, reserved, 160);
}

TEST_CASE("v1.0 layout of ballast_trace_slot") {
  CHECK(sizeof(ballast_trace_slot) == 192);
  FIELD(ballast_trace_slot, gen, 0);
  FIELD(ballast_trace_slot, comm_id, 8);
  FIELD(ballast_trace_slot, seq, 16);
  FIELD(ballast_trace_slot, count, 24);
  FIELD(ballast_trace_slot, bytes, 32);
  FIELD(ballast_trace_slot, op, 40);
  FIELD(ballast_trace_slot, dtype, 44);
  FIELD(ballast_trace_slot, redop, 48);
  FIELD(ballast_trace_slot, algorithm, 52);
  FIELD(ballast_trace_slot, rank, 56);
  FIELD(ballast_trace_slot, nranks, 60);
  FIELD(ballast_trace_slot, world_rank, 64);
  FIELD(ballast_trace_slot, peer, 68);
  FIELD(ballast_trace_slot, state, 72);
  FIELD(ballast_trace_slot, status, 76);
  FIELD(ballast_trace_slot, flags, 80);
  FIELD(ballast_trace_slot, wait_peer, 84);
  FIELD(ballast_trace_slot, send_peer, 88);
  FIELD(ballast_trace_slot, steps, 92);
  FIELD(ballast_trace_slot, step, 96);
  FIELD(ballast_trace_slot, reserved0, 100);
  FIELD(ballast_trace_slot, issue_tick, 104);
  FIELD(ballast_trace_slot, start_tick, 112);
  FIELD(ballast_trace_slot, end_tick, 120);
  FIELD(ballast_trace_slot, progress_tick, 128);
  FIELD(ballast_trace_slot, chunks_total, 136);
  FIELD(ballast_trace_slot, chunks_posted, 144);
  FIELD(ballast_trace_slot, chunks_sent, 152);
  FIELD(ballast_trace_slot, chunks_received, 160);
  FIELD(ballast_trace_slot, chunks_reduced, 168);
  FIELD(ballast_trace_slot, bytes_sent, 176);
  FIELD(ballast_trace_slot, bytes_received, 184);
}

TEST_CASE("v1 minimum sizes") {
  CHECK(BALLAST_COMM_CONFIG_V1_SIZE == 56);
  CHECK(BALLAST_COMM_ARGS_V1_SIZE == 56);
  CHECK(BALLAST_COMM_INFO_V1_SIZE == 32);
  CHECK(BALLAST_COMM_API_V1_SIZE == 88);
  CHECK(BALLAST_COMMAND_TABLE_V1_SIZE == 16);
  CHECK(BALLAST_EVENT_V1_SIZE == 64);
  CHECK(BALLAST_SUBSCRIBE_OPTIONS_V1_SIZE == 8);
  CHECK(BALLAST_METRIC_BATCH_V1_SIZE == 16);
  CHECK(BALLAST_OP_TIMING_BATCH_V1_SIZE == 16);
  CHECK(BALLAST_COLLECTIVE_RECORD_V1_SIZE == 104);
  CHECK(BALLAST_FAULT_REPORT_V1_SIZE == 72);
  CHECK(BALLAST_PLACEMENT_PLAN_V1_SIZE == 56);
  CHECK(BALLAST_RECOVERY_ACTION_V1_SIZE == 48);
  CHECK(BALLAST_STARTUP_STAGE_V1_SIZE == 48);
  CHECK(BALLAST_STRAGGLER_REPORT_V1_SIZE == 56);
  CHECK(BALLAST_HOST_API_V1_SIZE == 96);
  CHECK(BALLAST_PLUGIN_DESCRIPTOR_V1_SIZE == 80);
  CHECK(BALLAST_PLACEMENT_REQUEST_V1_SIZE == 48);
  CHECK(BALLAST_REPLACEMENT_REQUEST_V1_SIZE == 48);
  CHECK(BALLAST_SCHEDULER_API_V1_SIZE == 40);
  CHECK(BALLAST_STARTUP_LOAD_OPTIONS_V1_SIZE == 8);
  CHECK(BALLAST_STARTUP_API_V1_SIZE == 72);
}
