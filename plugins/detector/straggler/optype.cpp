#include "optype.hpp"

#include <array>

namespace ballast::straggler {
namespace {

constexpr std::array<std::string_view, kOpTypeCount> kNames = {
    "forward-compute",
    "backward-compute",
    "forward-send",
    "forward-recv",
    "backward-send",
    "backward-recv",
    "grads-reduce-scatter",
    "params-all-gather",
    "separate-grads-all-reduce",
    "embedding-grads-all-reduce",
    "layernorm-grads-all-reduce",
    "optimizer-clip-main-grad",
    "optimizer",
    "gc",
};

}  // namespace

std::string_view optype_name(OpType t) { return kNames[static_cast<size_t>(t)]; }

std::optional<OpType> parse_optype(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<OpType>(i);
  }
  return std::nullopt;
}

bool is_compute_kernel(OpType t) { return t == OpType::forward_compute || t == OpType::backward_compute; }

bool is_p2p(OpType t) {
  return t == OpType::forward_send || t == OpType::forward_recv || t == OpType::backward_send ||
         t == OpType::backward_recv;
}

bool is_communication(OpType t) {
  switch (t) {
    case OpType::forward_compute:
    case OpType::backward_compute:
    case OpType::optimizer:
    case OpType::gc:
      return false;
    default:
      return true;
  }
}

std::string_view report_name(OpType t) {
  switch (t) {
    case OpType::forward_send:
    case OpType::forward_recv:
      return "forward-pp-comm";
    case OpType::backward_send:
    case OpType::backward_recv:
      return "backward-pp-comm";
    default:
      return optype_name(t);
  }
}

}  // namespace ballast::straggler
