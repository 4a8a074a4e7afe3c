// libFuzzer: a metrics CSV (plain, or gzip by content), as `ballast detect --csv` reads it.
#include "memfd_input.hpp"
#include "metrics_csv.hpp"
#include "small_quarantine.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemfdInput in(data, size);
  ballast::machine::MetricsTable table;
  std::string error;
  (void)ballast::machine::read_metrics_csv(in.path(), &table, &error);
  return 0;
}
