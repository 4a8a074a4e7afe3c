#include "checkpoints.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>

namespace ballast::runner {

std::vector<Checkpoint> list_checkpoints(const std::string& dir) {
  std::vector<Checkpoint> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::string prefix = "step-", suffix = ".safetensors";
    if (name.size() != prefix.size() + 8 + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    int64_t step = 0;
    bool digits = true;
    for (size_t i = prefix.size(); i < prefix.size() + 8; ++i) {
      digits = digits && std::isdigit(static_cast<unsigned char>(name[i]));
      step = step * 10 + (name[i] - '0');
    }
    if (!digits || step <= 0 || !e.is_regular_file(ec)) continue;
    out.push_back({e.path().string(), step});
  }
  std::sort(out.begin(), out.end(), [](const Checkpoint& a, const Checkpoint& b) { return a.step < b.step; });
  return out;
}

Checkpoint find_checkpoint(const std::string& dir, int64_t max_step) {
  Checkpoint best;
  for (const auto& c : list_checkpoints(dir))
    if (max_step < 0 || c.step <= max_step) best = c;
  return best;
}

std::vector<Checkpoint> prune_checkpoints(const std::string& dir, int keep, int64_t protect_before) {
  std::vector<Checkpoint> removed;
  if (keep <= 0) return removed;
  const auto all = list_checkpoints(dir);
  const Checkpoint protect = protect_before > 0 ? find_checkpoint(dir, protect_before - 1) : Checkpoint{};
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) {
    if (all[i].path == protect.path) continue;
    std::error_code ec;
    if (std::filesystem::remove(all[i].path, ec)) removed.push_back(all[i]);
  }
  return removed;
}

}  // namespace ballast::runner
