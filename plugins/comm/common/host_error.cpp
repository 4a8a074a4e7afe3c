#include "host_error.hpp"

#include <atomic>

namespace ballast::comm {

namespace {
std::atomic<const ballast_host_api*> g_host{nullptr};
}  // namespace

void set_error_host(const ballast_host_api* host) { g_host.store(host, std::memory_order_release); }

void forget_error_host(const ballast_host_api* host) {
  g_host.compare_exchange_strong(host, nullptr, std::memory_order_acq_rel);
}

void report_error(const std::string& message) {
  if (const ballast_host_api* host = g_host.load(std::memory_order_acquire)) host->set_error(host, message.c_str());
}

}  // namespace ballast::comm
