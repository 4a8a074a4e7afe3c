// libFuzzer: a Prometheus text exposition, as the scraper parses it; each
// sample's series name is printed back.
#include "prometheus.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<ballast::collect::PromSample> samples;
  std::string error;
  if (ballast::collect::parse_exposition(text, &samples, &error)) {
    for (const auto& s : samples) (void)ballast::collect::series_name(s);
  }
  return 0;
}
