// A job trace: one row per recorded operation of one rank, in columns.
// Read from CSV or gzip-compressed CSV (the format of the what-if artifact:
// dp_rank, stage, rank, step, optype, start_ts, duration, seq_id, mc, mb_id,
// gmc, in any order given by the header), or filled from step.timing events.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "optype.hpp"

namespace ballast::straggler {

// Malformed input. The message names the file, the line and the column.
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TraceRow {
  int32_t dp_rank = 0;
  int32_t stage = 0;
  int32_t rank = 0;
  int64_t step = 0;
  OpType optype = OpType::forward_compute;
  double start = 0;     // seconds
  double duration = 0;  // seconds
  int32_t seq_id = 0;
  int32_t mc = -1;
  int32_t mb_id = -1;
  int32_t gmc = -1;
};

struct Trace {
  std::string source;  // file name, or "step.timing events"
  std::vector<TraceRow> rows;
  std::vector<uint32_t> lines;  // source line of each row; empty when not read from a file

  // "FILE:LINE" of a row, or "SOURCE (rank R, step S)" without lines.
  std::string where(size_t row) const;
};

// Parallelism sizes of the job (meta.yaml). 0 = not given: taken from the trace.
struct Meta {
  std::string trial_name;
  int dp = 0, pp = 0, tp = 1, dsp = 1, vpp = 1, world = 0;
};

// The most (dp_rank, stage) pairs a trace or meta.yaml may describe: the
// analysis keeps a cell for each (1,048,576: a million data-parallel rank
// times pipeline stage pairs, far beyond any job).
inline constexpr uint64_t kMaxGridCells = uint64_t{1} << 20;

// Read a trace, plain or gzip (by its magic bytes). Throws TraceError.
Trace read_trace(const std::string& path);
// Parse CSV text; `source` names it in errors. Throws TraceError.
Trace parse_trace_csv(std::string_view text, const std::string& source);
// Read meta.yaml (libyaml): one mapping, block or flow style, `---` allowed;
// dp_size, pp_size, tp_size, dsp_size, vpp_size, world_size, trial_name
// read, other scalar keys skipped; a nested value, an alias, a duplicate key
// or a second document is refused. Throws TraceError naming the file and line.
Meta read_meta(const std::string& path);

}  // namespace ballast::straggler
