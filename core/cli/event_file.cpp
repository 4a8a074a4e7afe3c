#include "event_file.hpp"

#include "error.hpp"
#include "journal.hpp"
#include "json_depth.hpp"

#include <cstring>
#include <fstream>

namespace ballast::cli {

int read_event_file(const std::string& path, const std::function<void(const OwnedEvent&)>& on_event) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(BALLAST_ENOTFOUND, path + ": cannot open: " + std::strerror(errno));
  char magic[4] = {};
  in.read(magic, 4);
  bool journal = in.gcount() == 4 && std::memcmp(magic, "BLF1", 4) == 0;
  if (journal) {
    in.close();
    std::string problem;
    int rc = read_journal(
        path, JournalMode::refuse_bad, [&](const OwnedEvent& ev, uint64_t) { on_event(ev); },
        [&](const JournalProblem& p) { problem = path + ": byte " + std::to_string(p.offset) + ": " + p.reason; });
    if (rc != BALLAST_OK) return fail(rc, problem.empty() ? std::string(last_error()) : problem);
    return BALLAST_OK;
  }
  in.clear();
  in.seekg(0);
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!json_depth_within(line))
      return fail(BALLAST_EFORMAT, path + ":" + std::to_string(number) + ": JSON nested deeper than " +
                                       std::to_string(kMaxJsonDepth) + " levels");
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return fail(BALLAST_EFORMAT, path + ":" + std::to_string(number) + ": not a JSON object");
    OwnedEvent ev;
    std::string error;
    if (event_from_json(j, &ev, &error) != BALLAST_OK)
      return fail(BALLAST_EFORMAT, path + ":" + std::to_string(number) + ": " + error);
    on_event(ev);
  }
  return BALLAST_OK;
}

}  // namespace ballast::cli
