#include "codec_schema.hpp"

#include <algorithm>
#include <iterator>

namespace ballast::codec {

namespace {

#define BF(S, F, T) \
  FieldDesc { #F, FieldType::T, static_cast < uint32_t>(offsetof(S, F)) }
// A field whose absence in JSON means -1 ("not given" in events.h).
#define BF_OR_NONE(S, F, T) \
  FieldDesc { #F, FieldType::T, static_cast < uint32_t>(offsetof(S, F)), -1 }
#define BF_ENUM(S, F, NAMES) \
  FieldDesc { #F, FieldType::u32, static_cast < uint32_t>(offsetof(S, F)), 0, NAMES, sizeof(NAMES) / sizeof(NAMES[0]) }
#define BF_ARRAY(S, F, ELEM, COUNT)                                                      \
  FieldDesc {                                                                            \
#F, FieldType::array, static_cast < uint32_t>(offsetof(S, F)), 0, nullptr, 0, &ELEM, \
        static_cast < uint32_t>(offsetof(S, COUNT))                                      \
  }
// An element struct (of an array): fixed at its v1.0 layout.
#define BSTRUCT(NAME, S, FIELDS) \
  StructDesc { NAME, sizeof(S), alignof(S), FIELDS, sizeof(FIELDS) / sizeof(FIELDS[0]), sizeof(S) }
// A payload struct: its v1 minimum, its schema id and its topics.
#define BPAYLOAD(NAME, S, FIELDS, V1, SCHEMA, TOPICS)                                            \
  StructDesc {                                                                                   \
    NAME, sizeof(S), alignof(S), FIELDS, sizeof(FIELDS) / sizeof(FIELDS[0]), V1, SCHEMA, TOPICS, \
        sizeof(TOPICS) / sizeof(TOPICS[0])                                                       \
  }

// ---- metric.sample
const FieldDesc kSampleFields[] = {
    BF(ballast_metric_sample, node, str),  BF(ballast_metric_sample, metric, str),
    BF(ballast_metric_sample, ts_ns, i64), BF(ballast_metric_sample, value, f64),
    BF(ballast_metric_sample, flags, u32),
};
const StructDesc kSample = BSTRUCT("metric_sample", ballast_metric_sample, kSampleFields);
const FieldDesc kMetricBatchFields[] = {
    BF(ballast_metric_batch, size, size),
    BF(ballast_metric_batch, count, count),
    BF_ARRAY(ballast_metric_batch, samples, kSample, count),
};
const char* const kMetricTopics[] = {"metric.sample"};
const StructDesc kMetricBatch = BPAYLOAD("metric_batch", ballast_metric_batch, kMetricBatchFields,
                                         BALLAST_METRIC_BATCH_V1_SIZE, BALLAST_SCHEMA_METRIC_BATCH, kMetricTopics);

// ---- step.timing
const FieldDesc kOpFields[] = {
    BF(ballast_op_timing, dp_rank, i32),     BF(ballast_op_timing, stage, i32),
    BF(ballast_op_timing, rank, i32),        BF(ballast_op_timing, step, i64),
    BF(ballast_op_timing, optype, str),      BF(ballast_op_timing, start_s, f64),
    BF(ballast_op_timing, duration_s, f64),  BF(ballast_op_timing, seq_id, i32),
    BF_OR_NONE(ballast_op_timing, mc, i32),  BF_OR_NONE(ballast_op_timing, mb_id, i32),
    BF_OR_NONE(ballast_op_timing, gmc, i32),
};
const StructDesc kOp = BSTRUCT("op_timing", ballast_op_timing, kOpFields);
const FieldDesc kOpBatchFields[] = {
    BF(ballast_op_timing_batch, size, size),
    BF(ballast_op_timing_batch, count, count),
    BF_ARRAY(ballast_op_timing_batch, ops, kOp, count),
};
const char* const kOpTopics[] = {"step.timing"};
const StructDesc kOpBatch = BPAYLOAD("op_timing_batch", ballast_op_timing_batch, kOpBatchFields,
                                     BALLAST_OP_TIMING_BATCH_V1_SIZE, BALLAST_SCHEMA_OP_TIMING_BATCH, kOpTopics);

// ---- collective.record / collective.progress
const char* const kCollStates[] = {"issued", "started", "done", "failed"};
const FieldDesc kCollFields[] = {
    BF(ballast_collective_record, size, size),
    BF_ENUM(ballast_collective_record, state, kCollStates),
    BF(ballast_collective_record, comm_id, u64),
    BF(ballast_collective_record, seq, u64),
    BF(ballast_collective_record, op, str),
    BF(ballast_collective_record, dtype, str),
    BF(ballast_collective_record, algorithm, str),
    BF(ballast_collective_record, count, u64),
    BF(ballast_collective_record, bytes, u64),
    BF(ballast_collective_record, rank, i32),
    BF(ballast_collective_record, nranks, i32),
    BF_OR_NONE(ballast_collective_record, peer, i32),
    BF(ballast_collective_record, status, i32),
    BF(ballast_collective_record, issue_ns, i64),
    BF(ballast_collective_record, start_ns, i64),
    BF(ballast_collective_record, end_ns, i64),
    BF(ballast_collective_record, chunks_posted, u64),
    BF(ballast_collective_record, chunks_sent, u64),
    BF(ballast_collective_record, chunks_received, u64),
    BF(ballast_collective_record, chunks_reduced, u64),
};
const char* const kCollTopics[] = {"collective.record", "collective.progress"};
const StructDesc kColl = BPAYLOAD("collective_record", ballast_collective_record, kCollFields,
                                  BALLAST_COLLECTIVE_RECORD_V1_SIZE, BALLAST_SCHEMA_COLLECTIVE_RECORD, kCollTopics);

// ---- fault.suspected / fault.confirmed / node.silent
const char* const kFaultStages[] = {"suspected", "confirmed"};
const FieldDesc kFaultFields[] = {
    BF(ballast_fault_report, size, size),         BF_ENUM(ballast_fault_report, stage, kFaultStages),
    BF(ballast_fault_report, subject, str),       BF_OR_NONE(ballast_fault_report, rank, i32),
    BF(ballast_fault_report, kind, str),          BF(ballast_fault_report, metric, str),
    BF(ballast_fault_report, score, f64),         BF(ballast_fault_report, confidence, f64),
    BF(ballast_fault_report, since_ns, i64),      BF(ballast_fault_report, detected_ns, i64),
    BF(ballast_fault_report, evidence, json_str), BF(ballast_fault_report, detector, str),
};
const char* const kFaultTopics[] = {"fault.suspected", "fault.confirmed", "node.silent"};
const StructDesc kFault = BPAYLOAD("fault_report", ballast_fault_report, kFaultFields, BALLAST_FAULT_REPORT_V1_SIZE,
                                   BALLAST_SCHEMA_FAULT_REPORT, kFaultTopics);

// ---- placement.plan
const FieldDesc kNodeFields[] = {
    BF(ballast_placement_node, name, str),
    BF(ballast_placement_node, pp_stage, i32),
    BF(ballast_placement_node, dp_row, i32),
    BF(ballast_placement_node, first_rank, i32),
};
const StructDesc kNode = BSTRUCT("placement_node", ballast_placement_node, kNodeFields);
const FieldDesc kPlanFields[] = {
    BF(ballast_placement_plan, size, size),
    BF(ballast_placement_plan, count, count),
    BF(ballast_placement_plan, job, str),
    BF(ballast_placement_plan, algorithm, str),
    BF_ARRAY(ballast_placement_plan, nodes, kNode, count),
    BF(ballast_placement_plan, max_dp_spread, i32),
    BF(ballast_placement_plan, max_pp_spread, i32),
    BF(ballast_placement_plan, objective, f64),
    BF(ballast_placement_plan, lower_bound, f64),
};
const char* const kPlanTopics[] = {"placement.plan"};
const StructDesc kPlan = BPAYLOAD("placement_plan", ballast_placement_plan, kPlanFields, BALLAST_PLACEMENT_PLAN_V1_SIZE,
                                  BALLAST_SCHEMA_PLACEMENT_PLAN, kPlanTopics);

// ---- recovery.action
const FieldDesc kActionFields[] = {
    BF(ballast_recovery_action, size, size),  BF(ballast_recovery_action, reserved, u32),
    BF(ballast_recovery_action, action, str), BF(ballast_recovery_action, subject, str),
    BF(ballast_recovery_action, reason, str), BF(ballast_recovery_action, args, json_str),
    BF(ballast_recovery_action, policy, str), BF(ballast_recovery_action, cause_topic, str),
};
const char* const kActionTopics[] = {"recovery.action"};
const StructDesc kAction = BPAYLOAD("recovery_action", ballast_recovery_action, kActionFields,
                                    BALLAST_RECOVERY_ACTION_V1_SIZE, BALLAST_SCHEMA_RECOVERY_ACTION, kActionTopics);

// ---- startup.stage
const FieldDesc kStageFields[] = {
    BF(ballast_startup_stage, size, size),        BF(ballast_startup_stage, status, i32),
    BF(ballast_startup_stage, stage, str),        BF(ballast_startup_stage, node, str),
    BF_OR_NONE(ballast_startup_stage, rank, i32), BF(ballast_startup_stage, start_ns, i64),
    BF(ballast_startup_stage, end_ns, i64),       BF(ballast_startup_stage, bytes, u64),
};
const char* const kStageTopics[] = {"startup.stage"};
const StructDesc kStage = BPAYLOAD("startup_stage", ballast_startup_stage, kStageFields, BALLAST_STARTUP_STAGE_V1_SIZE,
                                   BALLAST_SCHEMA_STARTUP_STAGE, kStageTopics);

// ---- straggler.report
const FieldDesc kCulpritFields[] = {
    BF(ballast_straggler_culprit, dimension, str),
    BF(ballast_straggler_culprit, name, str),
    BF(ballast_straggler_culprit, slowdown, f64),
};
const StructDesc kCulprit = BSTRUCT("straggler_culprit", ballast_straggler_culprit, kCulpritFields);
const FieldDesc kStragglerFields[] = {
    BF(ballast_straggler_report, size, size),      BF(ballast_straggler_report, count, count),
    BF(ballast_straggler_report, slowdown, f64),   BF(ballast_straggler_report, launch_slowdown, f64),
    BF(ballast_straggler_report, kind, str),       BF_ARRAY(ballast_straggler_report, culprits, kCulprit, count),
    BF(ballast_straggler_report, first_step, i64), BF(ballast_straggler_report, last_step, i64),
};
const char* const kStragglerTopics[] = {"straggler.report"};
const StructDesc kStraggler =
    BPAYLOAD("straggler_report", ballast_straggler_report, kStragglerFields, BALLAST_STRAGGLER_REPORT_V1_SIZE,
             BALLAST_SCHEMA_STRAGGLER_REPORT, kStragglerTopics);

#undef BF
#undef BF_OR_NONE
#undef BF_ENUM
#undef BF_ARRAY
#undef BSTRUCT
#undef BPAYLOAD

static_assert(std::max({sizeof(ballast_metric_batch), sizeof(ballast_op_timing_batch),
                        sizeof(ballast_collective_record), sizeof(ballast_fault_report), sizeof(ballast_placement_plan),
                        sizeof(ballast_recovery_action), sizeof(ballast_startup_stage),
                        sizeof(ballast_straggler_report)}) <= kMaxStructSize);

// In schema order: BALLAST_SCHEMA_METRIC_BATCH (2) first.
const StructDesc* const kWellKnown[] = {&kMetricBatch, &kOpBatch, &kColl,  &kFault,
                                        &kPlan,        &kAction,  &kStage, &kStraggler};

}  // namespace

const StructDesc* struct_for_schema(uint32_t schema) {
  constexpr uint32_t first = BALLAST_SCHEMA_METRIC_BATCH;
  if (schema < first || schema - first >= std::size(kWellKnown)) return nullptr;
  return kWellKnown[schema - first];
}

const StructDesc* const* well_known_structs(uint32_t* count) {
  *count = static_cast<uint32_t>(std::size(kWellKnown));
  return kWellKnown;
}

}  // namespace ballast::codec
