#include "whatif_command.hpp"

#include "command_line.hpp"

#include <filesystem>
#include <string>

#include "whatif.hpp"
#include "whatif_report.hpp"

namespace ballast::straggler {

int run_whatif(int argc, char** argv, std::FILE* out, std::FILE* err) {
  CLI::App app(
      "Straggler what-if analysis of a job trace: the slowdown against the same job with no "
      "stragglers, who causes it, and what kind of straggler it is.",
      argc > 0 ? argv[0] : "ballast whatif");
  std::string trace_path, meta_path, timeline_path;
  bool json = false;
  app.add_option("--trace", trace_path,
                 "per-op trace, CSV or gzip CSV (dp_rank,stage,rank,step,optype,start_ts,"
                 "duration,seq_id,mc,mb_id,gmc)")
      ->required();
  app.add_option("--meta", meta_path,
                 "meta.yaml with dp_size, pp_size, ... (default: meta.yaml beside the trace, "
                 "else sizes from the trace)");
  app.add_flag("--json", json, "print one JSON object");
  app.add_option("--timeline", timeline_path, "write a Chrome/Perfetto trace of the recorded and the ideal run");
  if (int rc = util::parse_command_line(app, argc, argv, out, err); rc >= 0) return rc;

  try {
    Meta meta;
    if (meta_path.empty()) {
      auto beside = std::filesystem::path(trace_path).parent_path() / "meta.yaml";
      std::error_code ec;
      if (std::filesystem::exists(beside, ec)) meta_path = beside.string();
    }
    if (!meta_path.empty()) meta = read_meta(meta_path);
    Trace trace = read_trace(trace_path);
    Timeline timeline;
    WhatIfResult result = analyze(trace, meta, {}, timeline_path.empty() ? nullptr : &timeline);
    if (!timeline_path.empty()) write_timeline(timeline, timeline_path);
    if (json) {
      nlohmann::ordered_json j = to_json(result);
      if (!meta_path.empty()) j["meta"] = meta_path;
      std::fprintf(out, "%s\n", j.dump().c_str());
    } else {
      std::fputs(human_report(result).c_str(), out);
      if (!timeline_path.empty())
        std::fprintf(out, "timeline: %s (open in https://ui.perfetto.dev or chrome://tracing)\n",
                     timeline_path.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(err, "%s: error: %s\n", app.get_name().c_str(), e.what());
    return 1;
  }
}

}  // namespace ballast::straggler
