// The layout rules of the ABI (DESIGN.md, "The C ABI"): every versioned
// struct starts with its uint32_t size, and the descriptor's required prefix
// ends where the header says.
#include <ballast/ballast.h>

#include <doctest/doctest.h>

#include <cstddef>
#include <string>

TEST_CASE("every versioned struct and table starts with its size") {
  CHECK(offsetof(ballast_event, size) == 0);
  CHECK(offsetof(ballast_subscribe_options, size) == 0);
  CHECK(offsetof(ballast_host_api, size) == 0);
  CHECK(offsetof(ballast_plugin_descriptor, size) == 0);
  CHECK(offsetof(ballast_command_table, size) == 0);
  CHECK(offsetof(ballast_metric_batch, size) == 0);
  CHECK(offsetof(ballast_op_timing_batch, size) == 0);
  CHECK(offsetof(ballast_collective_record, size) == 0);
  CHECK(offsetof(ballast_fault_report, size) == 0);
  CHECK(offsetof(ballast_placement_plan, size) == 0);
  CHECK(offsetof(ballast_recovery_action, size) == 0);
  CHECK(offsetof(ballast_startup_stage, size) == 0);
  CHECK(offsetof(ballast_straggler_report, size) == 0);
}

TEST_CASE("the descriptor's required prefix ends after destroy, before the optional fields") {
  CHECK(BALLAST_PLUGIN_DESCRIPTOR_V1_SIZE == offsetof(ballast_plugin_descriptor, get_interface));
  CHECK(BALLAST_PLUGIN_DESCRIPTOR_V1_SIZE < sizeof(ballast_plugin_descriptor));
}

TEST_CASE("status names are stable and total") {
  CHECK(std::string(ballast_status_name(BALLAST_OK)) == "BALLAST_OK");
  CHECK(std::string(ballast_status_name(BALLAST_EVERSION)) == "BALLAST_EVERSION");
  CHECK(std::string(ballast_status_name(BALLAST_EFENCED)) == "BALLAST_EFENCED");
  CHECK(BALLAST_EPLUGIN == -14);  // the values are ABI: a new one is appended
  CHECK(BALLAST_EFENCED == -15);
  CHECK(std::string(ballast_status_name(-999)) == "BALLAST_E(unknown)");
}
