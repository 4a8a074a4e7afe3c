#include "checkpoints.hpp"

#include <cctype>
#include <filesystem>

namespace ballast::runner {

Checkpoint find_checkpoint(const std::string& dir, int64_t max_step) {
  Checkpoint best;
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
    if (!digits || (max_step >= 0 && step > max_step) || step <= best.step) continue;
    if (!e.is_regular_file(ec)) continue;
    best = {e.path().string(), step};
  }
  return best;
}

}  // namespace ballast::runner
