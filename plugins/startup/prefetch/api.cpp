#include "api.hpp"

#include <string>
#include <vector>

#include "stages.hpp"
#include "striped_read.hpp"

namespace ballast::startup {

namespace {

thread_local std::string t_error;

}  // namespace
}  // namespace ballast::startup

// The opaque handle of the C ABI: a loaded file plus the views the table hands out.
struct ballast_startup_file {
  ballast::startup::LoadedFile file;
};

namespace ballast::startup {
namespace {

int fail(void* state, int status, const std::string& message) {
  t_error = message;
  auto* s = static_cast<ApiState*>(state);
  if (s != nullptr && s->host != nullptr && s->host->set_error != nullptr) s->host->set_error(s->host, message.c_str());
  return status;
}

int api_load(void* state, const char* path, const ballast_startup_load_options* o, ballast_startup_file** out) {
  if (path == nullptr || out == nullptr) return fail(state, BALLAST_EINVAL, "load: path and file must not be NULL");
  LoadOptions opt;
  if (o != nullptr) {
    // The ABI's size rule: a field the caller's size does not cover is 0.
    if (o->size < BALLAST_STARTUP_LOAD_OPTIONS_V1_SIZE)
      return fail(state, BALLAST_EINVAL, "load: options.size is smaller than ballast_startup_load_options v1");
    const auto has = [&](size_t end) { return o->size >= end; };
    const uint32_t flags = has(BALLAST_SIZE_TO(ballast_startup_load_options, flags)) ? o->flags : 0;
    if (o->stripes != 0) opt.stripes = o->stripes;
    if (has(BALLAST_SIZE_TO(ballast_startup_load_options, chunk_bytes)) && o->chunk_bytes != 0)
      opt.chunk_bytes = o->chunk_bytes;
    opt.direct = (flags & BALLAST_LOAD_DIRECT) ? 1 : (flags & BALLAST_LOAD_BUFFERED) ? 0 : -1;
    opt.share = (flags & BALLAST_LOAD_SHARE) != 0;
    opt.verify = (flags & BALLAST_LOAD_NO_VERIFY) == 0;
    if (has(BALLAST_SIZE_TO(ballast_startup_load_options, destination))) opt.destination = o->destination;
    if (has(BALLAST_SIZE_TO(ballast_startup_load_options, capacity))) opt.capacity = o->capacity;
  }
  try {
    auto* f = new ballast_startup_file{load_file(path, opt)};
    *out = f;
    return BALLAST_OK;
  } catch (const Error& e) {
    return fail(state, BALLAST_EIO, e.what());
  } catch (const std::bad_alloc&) {
    return fail(state, BALLAST_ENOMEM, std::string(path) + ": out of memory");
  } catch (const std::exception& e) {
    return fail(state, BALLAST_EINTERNAL, e.what());
  }
}

const void* api_data(const ballast_startup_file* f, uint64_t* bytes) {
  if (f == nullptr) return nullptr;
  if (bytes != nullptr) *bytes = f->file.size;
  return f->file.data;
}

uint32_t api_checksum(const ballast_startup_file* f) { return f ? f->file.checksum : 0; }

uint32_t api_tensor_count(const ballast_startup_file* f) { return f ? uint32_t(f->file.header.tensors.size()) : 0; }

int api_tensor(const ballast_startup_file* f, uint32_t i, ballast_startup_tensor* out) {
  if (f == nullptr || out == nullptr || i >= f->file.header.tensors.size()) return BALLAST_EINVAL;
  const TensorInfo& t = f->file.header.tensors[i];
  out->name = t.name.c_str();
  out->dtype = t.dtype.c_str();
  out->ndim = uint32_t(t.shape.size());
  out->shape = t.shape.data();
  out->offset = f->file.header.data_offset + t.begin;
  out->bytes = t.end - t.begin;
  return BALLAST_OK;
}

void api_release(void*, ballast_startup_file* f) { delete f; }

int api_stage(void* state, const char* name, int64_t start_ns, int64_t end_ns, uint64_t bytes, int32_t status) {
  if (name == nullptr || *name == '\0' || end_ns < start_ns)
    return fail(state, BALLAST_EINVAL, "stage: a name and start_ns <= end_ns are needed");
  auto* s = static_cast<ApiState*>(state);
  StageLog log(s ? s->host : nullptr, "");
  StageRecord r;
  r.stage = name;
  r.start_ns = start_ns;
  r.end_ns = end_ns;
  r.bytes = bytes;
  r.status = status;
  log.record(std::move(r));
  return BALLAST_OK;
}

const char* api_last_error(void*) { return t_error.c_str(); }

const ballast_startup_api kApi = {sizeof(ballast_startup_api),
                                  api_load,
                                  api_data,
                                  api_checksum,
                                  api_tensor_count,
                                  api_tensor,
                                  api_release,
                                  api_stage,
                                  api_last_error};

}  // namespace

const ballast_startup_api* startup_api() { return &kApi; }

}  // namespace ballast::startup
