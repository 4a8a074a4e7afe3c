#include "nvml.hpp"

#include <dlfcn.h>

#include <climits>
#include <cstring>

namespace ballast::collect {

namespace {

// The few NVML types used, as nvml.h declares them (the header is not needed
// to build: NVML's ABI is stable C).
using Device = void*;
using EventSet = void*;
struct Utilization {
  unsigned gpu, memory;
};
struct Memory {
  unsigned long long total, free, used;
};
union Value {
  double d;
  unsigned u;
  unsigned long ul;
  unsigned long long ull;
  long long sll;
};
struct FieldValue {
  unsigned field_id, scope_id;
  long long timestamp, latency_usec;
  int value_type, ret;
  Value value;
};
struct EventData {
  Device device;
  unsigned long long type, data;
  unsigned gpu_instance, compute_instance;
};
constexpr int kSuccess = 0;
constexpr unsigned long long kXidCriticalError = 0x8;
constexpr unsigned kNvlinkTx = 138, kNvlinkRx = 139;  // NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}, KiB

}  // namespace

struct Nvml::Api {
  int (*init)();
  int (*shutdown)();
  const char* (*error_string)(int);
  int (*count)(unsigned*);
  int (*handle)(unsigned, Device*);
  int (*utilization)(Device, Utilization*);
  int (*memory)(Device, Memory*);
  int (*power)(Device, unsigned*);
  int (*temperature)(Device, int, unsigned*);
  int (*clock)(Device, int, unsigned*);
  int (*ecc)(Device, int, int, unsigned long long*);
  int (*pcie)(Device, int, unsigned*);
  int (*fields)(Device, int, FieldValue*);
  int (*event_set_create)(EventSet*);
  int (*register_events)(Device, unsigned long long, EventSet);
  int (*event_wait)(EventSet, EventData*, unsigned);
  int (*event_set_free)(EventSet);
};

Nvml::~Nvml() {
  if (events_ && api_->event_set_free) api_->event_set_free(events_);
  if (initialised_) api_->shutdown();
  delete api_;
  // The library stays loaded: the driver may keep threads in it.
}

bool Nvml::open(std::string* why, const std::string& library) {
  lib_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib_) {
    const char* e = dlerror();
    *why = e ? e : library + ": cannot load";
    return false;
  }
  api_ = new Api{};
  struct Sym {
    const char* name;
    void** slot;
    bool required;
  } syms[] = {
      {"nvmlInit_v2", reinterpret_cast<void**>(&api_->init), true},
      {"nvmlShutdown", reinterpret_cast<void**>(&api_->shutdown), true},
      {"nvmlErrorString", reinterpret_cast<void**>(&api_->error_string), true},
      {"nvmlDeviceGetCount_v2", reinterpret_cast<void**>(&api_->count), true},
      {"nvmlDeviceGetHandleByIndex_v2", reinterpret_cast<void**>(&api_->handle), true},
      {"nvmlDeviceGetUtilizationRates", reinterpret_cast<void**>(&api_->utilization), true},
      {"nvmlDeviceGetMemoryInfo", reinterpret_cast<void**>(&api_->memory), true},
      {"nvmlDeviceGetPowerUsage", reinterpret_cast<void**>(&api_->power), false},
      {"nvmlDeviceGetTemperature", reinterpret_cast<void**>(&api_->temperature), false},
      {"nvmlDeviceGetClockInfo", reinterpret_cast<void**>(&api_->clock), false},
      {"nvmlDeviceGetTotalEccErrors", reinterpret_cast<void**>(&api_->ecc), false},
      {"nvmlDeviceGetPcieThroughput", reinterpret_cast<void**>(&api_->pcie), false},
      {"nvmlDeviceGetFieldValues", reinterpret_cast<void**>(&api_->fields), false},
      {"nvmlEventSetCreate", reinterpret_cast<void**>(&api_->event_set_create), false},
      {"nvmlDeviceRegisterEvents", reinterpret_cast<void**>(&api_->register_events), false},
      {"nvmlEventSetWait_v2", reinterpret_cast<void**>(&api_->event_wait), false},
      {"nvmlEventSetFree", reinterpret_cast<void**>(&api_->event_set_free), false},
  };
  for (const Sym& s : syms) {
    *s.slot = dlsym(lib_, s.name);
    if (!*s.slot && s.required) {
      *why = library + ": no symbol " + s.name + " (not NVML?)";
      return false;
    }
  }
  int rc = api_->init();
  if (rc != kSuccess) {
    *why = library + ": nvmlInit_v2 failed: " + api_->error_string(rc);
    return false;
  }
  initialised_ = true;
  unsigned n = 0;
  rc = api_->count(&n);
  if (rc != kSuccess) {
    *why = library + ": nvmlDeviceGetCount_v2 failed: " + api_->error_string(rc);
    return false;
  }
  for (unsigned i = 0; i < n; ++i) {
    Device d = nullptr;
    if (api_->handle(i, &d) == kSuccess) devices_.push_back(d);
  }
  if (api_->event_set_create && api_->register_events && api_->event_wait &&
      api_->event_set_create(&events_) == kSuccess) {
    for (Device d : devices_) api_->register_events(d, kXidCriticalError, events_);
  }
  if (devices_.empty()) {
    *why = library + ": NVML found no GPU";
    return false;
  }
  return true;
}

void Nvml::sample(int64_t ts, Rates* rates, std::vector<Sample>* out) {
  std::vector<double> xids(devices_.size(), 0.0);
  if (events_) {
    EventData ev{};
    // Drain pending events without waiting (timeout 0).
    for (int k = 0; k < 1024 && api_->event_wait(events_, &ev, 0) == kSuccess; ++k)
      for (size_t i = 0; i < devices_.size(); ++i)
        if (devices_[i] == ev.device && (ev.type & kXidCriticalError)) xids[i] += 1;
  }
  for (size_t i = 0; i < devices_.size(); ++i) {
    Device d = devices_[i];
    std::string p = "gpu" + std::to_string(i) + ".";
    Utilization u{};
    if (api_->utilization(d, &u) == kSuccess) {
      add_gauge(out, p + "util", u.gpu);
      add_gauge(out, p + "mem_util", u.memory);
    }
    Memory m{};
    if (api_->memory(d, &m) == kSuccess) add_gauge(out, p + "mem_used_bytes", static_cast<double>(m.used));
    unsigned v = 0;
    if (api_->power && api_->power(d, &v) == kSuccess) add_gauge(out, p + "power", v / 1000.0);
    if (api_->temperature && api_->temperature(d, 0, &v) == kSuccess) add_gauge(out, p + "temp", v);
    if (api_->clock && api_->clock(d, 1, &v) == kSuccess) add_gauge(out, p + "sm_clock", v);
    if (api_->clock && api_->clock(d, 2, &v) == kSuccess) add_gauge(out, p + "mem_clock", v);
    unsigned long long ecc = 0;
    if (api_->ecc && api_->ecc(d, 0, 0, &ecc) == kSuccess)
      add_gauge(out, p + "ecc.corrected", static_cast<double>(ecc));
    if (api_->ecc && api_->ecc(d, 1, 0, &ecc) == kSuccess)
      add_gauge(out, p + "ecc.uncorrected", static_cast<double>(ecc));
    if (api_->pcie && api_->pcie(d, 0, &v) == kSuccess) add_gauge(out, p + "pcie.tx_bytes", v * 1024.0);
    if (api_->pcie && api_->pcie(d, 1, &v) == kSuccess) add_gauge(out, p + "pcie.rx_bytes", v * 1024.0);
    if (api_->fields) {
      FieldValue f[2]{};
      f[0].field_id = kNvlinkTx;
      f[1].field_id = kNvlinkRx;
      f[0].scope_id = f[1].scope_id = UINT_MAX;  // summed over the links
      if (api_->fields(d, 2, f) == kSuccess) {
        if (f[0].ret == kSuccess)
          rates->add(out, p + "nvlink.tx_bytes", static_cast<double>(f[0].value.ull), ts, 1024.0);
        if (f[1].ret == kSuccess)
          rates->add(out, p + "nvlink.rx_bytes", static_cast<double>(f[1].value.ull), ts, 1024.0);
      }
    }
    if (events_) add_gauge(out, p + "xid", xids[i]);
  }
}

}  // namespace ballast::collect
