// Operation types of a training step, as the straggler traces name them.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ballast::straggler {

enum class OpType : uint8_t {
  forward_compute,
  backward_compute,
  forward_send,
  forward_recv,
  backward_send,
  backward_recv,
  grads_reduce_scatter,
  params_all_gather,
  separate_grads_all_reduce,
  embedding_grads_all_reduce,
  layernorm_grads_all_reduce,
  optimizer_clip_main_grad,
  optimizer,
  gc,
};
inline constexpr int kOpTypeCount = 14;

// The trace's name of a type ("forward-compute").
std::string_view optype_name(OpType t);
// The type with that name, or nothing.
std::optional<OpType> parse_optype(std::string_view name);

bool is_compute_kernel(OpType t);  // forward-compute, backward-compute
bool is_p2p(OpType t);             // pipeline send/recv
// Communication in the sense of the ideal run: its ideal duration is the
// median of its type (computation takes the mean).
bool is_communication(OpType t);
// The name a type is reported under: pipeline sends and receives of one
// direction are one group ("forward-pp-comm"), the others keep their name.
std::string_view report_name(OpType t);

}  // namespace ballast::straggler
