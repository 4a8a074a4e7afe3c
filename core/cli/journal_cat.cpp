// ballast journal cat FILE [--json]: print a journal. Bad frames are reported
// with their byte offset and skipped (--strict: refused); exit 1 if any.
#include "commands.hpp"

#include "error.hpp"
#include "journal.hpp"

#include <cstdio>

namespace ballast::cli {

void add_journal(CLI::App& app) {
  auto* journal = app.add_subcommand("journal", "Work with event journals");
  journal->require_subcommand(1);
  auto* cat = journal->add_subcommand("cat", "Print the events of a journal");
  static std::string path;
  static bool json = false, strict = false;
  cat->add_option("FILE", path, "The journal file")->required();
  cat->add_flag("--json", json, "One JSON object per event");
  cat->add_flag("--strict", strict, "Stop at the first bad frame instead of skipping it");
  cat->callback([] {
    size_t problems = 0, events = 0;
    int rc = read_journal(
        path, strict ? JournalMode::refuse_bad : JournalMode::skip_bad,
        [&](const OwnedEvent& ev, uint64_t offset) {
          ++events;
          nlohmann::json j = event_to_json(ev.view());
          if (json) {
            std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
          } else {
            const ballast_event& e = ev.view();
            std::printf("@%-10llu %.6f %-22s %s/%s %s\n", static_cast<unsigned long long>(offset), e.ts_ns / 1e9,
                        e.topic, e.source.node ? e.source.node : "-", e.source.plugin ? e.source.plugin : "-",
                        j.contains("payload")
                            ? j["payload"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str()
                            : "");
          }
        },
        [&](const JournalProblem& p) {
          ++problems;
          std::fprintf(stderr, "ballast journal cat: %s: byte %llu: %s\n", path.c_str(),
                       static_cast<unsigned long long>(p.offset), p.reason.c_str());
        });
    if (rc != BALLAST_OK && problems == 0) std::fprintf(stderr, "ballast journal cat: %s\n", last_error());
    if (!json) std::fprintf(stderr, "%zu event(s), %zu bad frame(s)\n", events, problems);
    set_exit_code(rc == BALLAST_OK && problems == 0 ? 0 : 1);
  });
}

}  // namespace ballast::cli
