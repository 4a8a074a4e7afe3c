// GPU metrics through NVML, loaded with dlopen at run time: the collector
// builds and runs on machines without the NVIDIA driver.
//
// Metrics per GPU N: gpuN.util gpuN.mem_util (percent), gpuN.mem_used_bytes,
// gpuN.power (W), gpuN.temp (C), gpuN.sm_clock gpuN.mem_clock (MHz),
// gpuN.ecc.corrected gpuN.ecc.uncorrected (volatile counts), gpuN.pcie.tx_bytes
// gpuN.pcie.rx_bytes, gpuN.nvlink.tx_bytes gpuN.nvlink.rx_bytes (bytes/s),
// gpuN.xid (critical Xid events since the previous sample). A query a GPU
// does not support is skipped for that GPU.
#pragma once

#include "samples.hpp"

#include <string>
#include <vector>

namespace ballast::collect {

class Nvml {
 public:
  Nvml() = default;
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // Load `library`, initialise NVML and find the GPUs. False with *why (the
  // library, the symbol or the NVML error) when there is no usable NVML.
  bool open(std::string* why, const std::string& library = "libnvidia-ml.so.1");
  unsigned gpu_count() const { return static_cast<unsigned>(devices_.size()); }
  void sample(int64_t ts_ns, Rates* rates, std::vector<Sample>* out);

 private:
  struct Api;
  void* lib_ = nullptr;
  Api* api_ = nullptr;
  bool initialised_ = false;
  void* events_ = nullptr;
  std::vector<void*> devices_;
};

}  // namespace ballast::collect
