#include "checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace trainer {

namespace {

constexpr const char* kFormat = "ballast-trainer/1";

std::string hex(const std::string& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string unhex(const std::string& text, const std::string& where) {
  auto nibble = [&](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw std::runtime_error(where + ": vocab is not lower-case hex");
  };
  if (text.size() % 2) throw std::runtime_error(where + ": vocab has an odd number of hex digits");
  std::string out;
  for (size_t i = 0; i < text.size(); i += 2) out.push_back(char(nibble(text[i]) * 16 + nibble(text[i + 1])));
  return out;
}

// One tensor of the file: a view of the parameters or of one of Adam's moments.
struct Part {
  std::string name;
  std::vector<int64_t> shape;
  float* data;
  size_t count;
};

std::vector<Part> parts(Model& model, Adam& adam) {
  std::vector<Part> out;
  const std::pair<const char*, float*> sources[] = {
      {"", model.params().data()}, {"adam.m.", adam.m().data()}, {"adam.v.", adam.v().data()}};
  for (const auto& [prefix, base] : sources)
    for (const auto& t : model.tensors()) out.push_back({prefix + t.name, t.shape, base + t.offset, t.count});
  return out;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw std::runtime_error("checkpoint " + path + ": write: " + std::strerror(errno));
    p += w;
    n -= size_t(w);
  }
}

std::string field(const nlohmann::json& meta, const char* key, const std::string& where) {
  auto it = meta.find(key);
  if (it == meta.end() || !it->is_string())
    throw std::runtime_error(where + ": __metadata__ has no string field '" + key + "'");
  return it->get<std::string>();
}

uint64_t number(const nlohmann::json& meta, const char* key, const std::string& where) {
  const std::string s = field(meta, key, where);
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || *end || errno)
    throw std::runtime_error(where + ": __metadata__ field '" + key + "' is not a number: " + s);
  return v;
}

}  // namespace

Written write_checkpoint(const std::string& dir, const CheckpointMeta& meta, Model& model, Adam& adam) {
  char name[64];
  std::snprintf(name, sizeof name, "step-%08" PRIu64 ".safetensors", meta.step);
  const std::string path = dir + "/" + name;
  const std::string tmp = dir + "/." + name + ".tmp-" + std::to_string(getpid());

  nlohmann::json header = nlohmann::json::object();
  const std::vector<Part> all = parts(model, adam);
  uint64_t offset = 0;
  for (const auto& p : all) {
    header[p.name] = {{"dtype", "F32"}, {"shape", p.shape}, {"data_offsets", {offset, offset + p.count * 4}}};
    offset += p.count * 4;
  }
  char lr[32];
  std::snprintf(lr, sizeof lr, "%.9g", double(meta.lr));
  header["__metadata__"] = {{"format", kFormat},
                            {"step", std::to_string(meta.step)},
                            {"seed", std::to_string(meta.seed)},
                            {"world_size", std::to_string(meta.world_size)},
                            {"batch", std::to_string(meta.batch)},
                            {"lr", lr},
                            {"context", std::to_string(meta.shape.context)},
                            {"embed", std::to_string(meta.shape.embed)},
                            {"hidden", std::to_string(meta.shape.hidden)},
                            {"vocab", hex(meta.vocab)}};
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // data 8-byte aligned, as safetensors writers do
  const uint64_t header_size = text.size();
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = (unsigned char)(header_size >> (8 * i));

  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("checkpoint " + tmp + ": open: " + std::strerror(errno));
  try {
    write_all(fd, prefix, 8, tmp);
    write_all(fd, text.data(), text.size(), tmp);
    for (const auto& p : all) write_all(fd, p.data, p.count * 4, tmp);  // little-endian hosts only (x86-64, arm64)
    if (::fsync(fd) != 0) throw std::runtime_error("checkpoint " + tmp + ": fsync: " + std::strerror(errno));
    if (::close(fd) != 0) throw std::runtime_error("checkpoint " + tmp + ": close: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw std::runtime_error("checkpoint " + path + ": rename: " + why);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || ::fsync(dfd) != 0) {
    const std::string why = std::strerror(errno);
    if (dfd >= 0) ::close(dfd);
    throw std::runtime_error("checkpoint folder " + dir + ": fsync: " + why);
  }
  ::close(dfd);
  return {path, 8 + header_size + offset};
}

CheckpointMeta read_meta(const LoadedFile& file) {
  const std::string where = "checkpoint " + file.path;
  if (file.size < 8) throw std::runtime_error(where + ": shorter than a safetensors header");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(file.data[i]) << (8 * i);
  if (n > file.size - 8) throw std::runtime_error(where + ": header length runs past the end of the file");
  const auto header = nlohmann::json::parse(file.data + 8, file.data + 8 + n, nullptr, false);
  if (!header.is_object()) throw std::runtime_error(where + ": the header is not a JSON object");
  auto m = header.find("__metadata__");
  if (m == header.end() || !m->is_object())
    throw std::runtime_error(where + ": no __metadata__ (not a ballast-trainer checkpoint)");
  if (field(*m, "format", where) != kFormat)
    throw std::runtime_error(where + ": __metadata__ format is '" + field(*m, "format", where) + "', not " + kFormat);
  CheckpointMeta meta;
  meta.step = number(*m, "step", where);
  meta.seed = number(*m, "seed", where);
  meta.world_size = int(number(*m, "world_size", where));
  meta.batch = int(number(*m, "batch", where));
  meta.lr = std::strtof(field(*m, "lr", where).c_str(), nullptr);
  meta.shape.context = int(number(*m, "context", where));
  meta.shape.embed = int(number(*m, "embed", where));
  meta.shape.hidden = int(number(*m, "hidden", where));
  meta.vocab = unhex(field(*m, "vocab", where), where);
  meta.shape.vocab = int(meta.vocab.size());
  return meta;
}

void read_tensors(const LoadedFile& file, Model& model, Adam& adam) {
  const std::string where = "checkpoint " + file.path;
  for (const auto& p : parts(model, adam)) {
    const LoadedTensor* found = nullptr;
    for (const auto& t : file.tensors)
      if (t.name == p.name) found = &t;
    if (!found) throw std::runtime_error(where + ": no tensor '" + p.name + "'");
    if (found->dtype != "F32")
      throw std::runtime_error(where + ": tensor '" + p.name + "' is " + found->dtype + ", not F32");
    if (found->shape != p.shape) {
      std::string want, got;
      for (auto d : p.shape) want += (want.empty() ? "" : ",") + std::to_string(d);
      for (auto d : found->shape) got += (got.empty() ? "" : ",") + std::to_string(d);
      throw std::runtime_error(where + ": tensor '" + p.name + "' has shape [" + got + "], the model needs [" + want +
                               "]");
    }
    if (found->bytes != p.count * 4 || found->offset + found->bytes > file.size)
      throw std::runtime_error(where + ": tensor '" + p.name + "' has the wrong size");
    std::memcpy(p.data, file.data + found->offset, found->bytes);
  }
}

}  // namespace trainer
