// libFuzzer: the body of a bootstrap hello (what rank 0 reads from any
// connection, after its MAC) and, from the same bytes, the table a rank
// reads from rank 0.
#include "bootstrap.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ballast::comm::HelloBody hello;
  (void)ballast::comm::decode_hello(data, size, &hello);
  uint64_t job_id = 0;
  std::vector<ballast::comm::PeerInfo> peers;
  for (int nranks : {1, 4, 1 << 20}) (void)ballast::comm::decode_table(data, size, nranks, &job_id, &peers);
  return 0;
}
