#include "plugin_loader.hpp"

#include "error.hpp"

#include <boost/dll/shared_library.hpp>

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

namespace fs = std::filesystem;

namespace ballast {

namespace {

// Every library ever loaded. Intentionally never destroyed: destroying a
// boost::dll::shared_library would dlclose it, and plugins stay resident.
struct Registry {
  std::mutex mutex;
  std::map<std::string, boost::dll::shared_library*> libraries;  // canonical path ->
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

std::string refused(const std::string& path, const std::string& why) { return "plugin " + path + " refused: " + why; }

bool valid_plugin_name(const char* name) {
  if (name == nullptr || *name == '\0' || std::strlen(name) > 64) return false;
  for (const char* p = name; *p; ++p) {
    char c = *p;
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  }
  return true;
}

// A descriptor string: NULL allowed (returns ""), else bounded length.
bool read_string(const char* s, std::string* out) {
  if (s == nullptr) {
    out->clear();
    return true;
  }
  size_t n = strnlen(s, 4096);
  if (n == 4096) return false;
  out->assign(s, n);
  return true;
}

// The address ranges of loaded plugins, for plugin_containing: fixed
// arrays, appended to under the registry's mutex, read by a signal handler.
constexpr size_t kMaxRanges = 256;
struct Range {
  uintptr_t lo, hi;
  char path[512];
};
Range g_ranges[kMaxRanges];
std::atomic<size_t> g_range_count{0};

void record_ranges(const std::string& path) {
  struct Ctx {
    const std::string* path;
  } ctx{&path};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        const std::string& want = *static_cast<Ctx*>(data)->path;
        std::error_code ec;
        if (info->dlpi_name == nullptr || *info->dlpi_name == '\0' || fs::canonical(info->dlpi_name, ec) != want)
          return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          const size_t n = g_range_count.load(std::memory_order_relaxed);
          if (ph.p_type != PT_LOAD || n == kMaxRanges) continue;
          Range& r = g_ranges[n];
          r.lo = info->dlpi_addr + ph.p_vaddr;
          r.hi = r.lo + ph.p_memsz;
          std::snprintf(r.path, sizeof r.path, "%s", want.c_str());
          g_range_count.store(n + 1, std::memory_order_release);
        }
        return 1;
      },
      &ctx);
}

}  // namespace

const char* plugin_containing(uintptr_t address) {
  const size_t n = g_range_count.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i)
    if (address >= g_ranges[i].lo && address < g_ranges[i].hi) return g_ranges[i].path;
  return nullptr;
}

bool PluginFile::offers(const char* interface_name, uint32_t version) const {
  for (const auto& i : interfaces)
    if (i.name == interface_name && i.version == version) return true;
  return false;
}

int check_elf_file(const std::string& path, std::string* reason) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *reason = "cannot open: " + std::string(std::strerror(errno));
    return BALLAST_ENOTFOUND;
  }
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  Elf64_Ehdr eh{};
  if (file_size < sizeof eh || !in.read(reinterpret_cast<char*>(&eh), sizeof eh)) {
    *reason = "not an ELF file (only " + std::to_string(file_size) + " bytes)";
    return BALLAST_EFORMAT;
  }
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    *reason = "not an ELF file (bad magic)";
    return BALLAST_EFORMAT;
  }
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || (eh.e_machine != EM_X86_64 && eh.e_machine != EM_AARCH64)) {
    *reason = "ELF class or machine is not this host's";
    return BALLAST_EFORMAT;
  }
  if (eh.e_type != ET_DYN) {
    *reason = "not a shared object (ELF type " + std::to_string(eh.e_type) + ")";
    return BALLAST_EFORMAT;
  }
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 ||
      eh.e_phoff + uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr) > file_size) {
    *reason = "program header table lies outside the file (truncated?)";
    return BALLAST_EFORMAT;
  }
  if (eh.e_shoff != 0 && eh.e_shoff + uint64_t{eh.e_shnum} * eh.e_shentsize > file_size) {
    *reason = "section header table lies outside the file (truncated?)";
    return BALLAST_EFORMAT;
  }
  in.seekg(static_cast<std::streamoff>(eh.e_phoff));
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    if (!in.read(reinterpret_cast<char*>(&ph), sizeof ph)) {
      *reason = "cannot read program header " + std::to_string(i);
      return BALLAST_EFORMAT;
    }
    if ((ph.p_type == PT_LOAD || ph.p_type == PT_DYNAMIC) && ph.p_offset + ph.p_filesz > file_size) {
      *reason = "segment " + std::to_string(i) + " ends at byte " + std::to_string(ph.p_offset + ph.p_filesz) +
                " but the file has " + std::to_string(file_size) + " (truncated)";
      return BALLAST_EFORMAT;
    }
  }
  return BALLAST_OK;
}

int load_plugin_file(const std::string& path_in, PluginFile* out) {
  std::error_code ec;
  fs::path canonical = fs::canonical(path_in, ec);
  if (ec) return fail(BALLAST_ENOTFOUND, refused(path_in, "no such file"));
  const std::string path = canonical.string();

  std::string reason;
  if (int rc = check_elf_file(path, &reason); rc != BALLAST_OK) return fail(rc, refused(path, reason));

  boost::dll::shared_library* library = nullptr;
  {
    std::lock_guard lock(registry().mutex);
    auto it = registry().libraries.find(path);
    if (it != registry().libraries.end()) {
      library = it->second;
    } else {
      boost::dll::fs::error_code dll_ec;
      auto* lib = new boost::dll::shared_library(
          path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, dll_ec);
      if (dll_ec || !lib->is_loaded()) {
        const char* dl = dlerror();
        std::string why = dl ? dl : dll_ec.message();
        delete lib;  // nothing was loaded
        return fail(BALLAST_EFORMAT, refused(path, "dlopen failed: " + why));
      }
      library = lib;
      registry().libraries.emplace(path, lib);
      record_ranges(path);
    }
  }

  if (!library->has(BALLAST_PLUGIN_ENTRY))
    return fail(BALLAST_ENOTFOUND, refused(path, std::string("no symbol ") + BALLAST_PLUGIN_ENTRY +
                                                     " (not a Ballast plugin, or built for another ABI major)"));
  auto entry = library->get<const ballast_plugin_descriptor*(uint32_t)>(BALLAST_PLUGIN_ENTRY);

  // The symbol must be the plugin's own, not one a dependency exports.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(entry), &info) == 0 || info.dli_fname == nullptr ||
      fs::canonical(info.dli_fname, ec) != canonical)
    return fail(BALLAST_EFORMAT, refused(path, std::string(BALLAST_PLUGIN_ENTRY) + " is defined in " +
                                                   (info.dli_fname ? info.dli_fname : "an unknown object") +
                                                   ", not in the plugin file itself"));

  // Negotiation: the first and only call before the descriptor is validated.
  const ballast_plugin_descriptor* d = entry(BALLAST_ABI_MINOR);
  if (d == nullptr)
    return fail(BALLAST_EVERSION, refused(path, "the plugin declined ABI 1." + std::to_string(BALLAST_ABI_MINOR) +
                                                    " (it needs a newer host)"));
  if (d->size < BALLAST_PLUGIN_DESCRIPTOR_V1_SIZE)
    return fail(BALLAST_EFORMAT,
                refused(path, "descriptor size " + std::to_string(d->size) + " is smaller than the required " +
                                  std::to_string(BALLAST_PLUGIN_DESCRIPTOR_V1_SIZE)));
  if (d->abi_major != BALLAST_ABI_MAJOR)
    return fail(BALLAST_EVERSION, refused(path, "descriptor abi_major is " + std::to_string(d->abi_major) +
                                                    ", this host serves " + std::to_string(BALLAST_ABI_MAJOR)));
  if (!valid_plugin_name(d->name))
    return fail(BALLAST_EFORMAT, refused(path, "descriptor name is missing or not [a-z0-9_-]{1,64}"));
  if (d->create == nullptr || d->destroy == nullptr)
    return fail(BALLAST_EFORMAT, refused(path, std::string("descriptor of '") + d->name + "' lacks " +
                                                   (d->create == nullptr ? "create" : "destroy")));

  PluginFile f;
  f.path = path;
  f.descriptor = d;
  f.descriptor_size = d->size;
  f.name = d->name;
  f.abi_major = d->abi_major;
  f.abi_minor = d->abi_minor;
  if (!read_string(d->version, &f.version) || !read_string(d->kind, &f.kind) ||
      !read_string(d->description, &f.description))
    return fail(BALLAST_EFORMAT, refused(path, "a descriptor string is not NUL-terminated within 4096 bytes"));

  auto covers = [&](size_t end) { return d->size >= end; };
  if (covers(offsetof(ballast_plugin_descriptor, get_interface) + sizeof d->get_interface))
    f.get_interface = d->get_interface;
  if (covers(offsetof(ballast_plugin_descriptor, interfaces) + sizeof d->interfaces) && d->interfaces) {
    for (size_t i = 0; d->interfaces[i].name != nullptr; ++i) {
      if (i == 256) return fail(BALLAST_EFORMAT, refused(path, "interfaces list is not terminated by {NULL, 0}"));
      std::string n;
      if (!read_string(d->interfaces[i].name, &n))
        return fail(BALLAST_EFORMAT, refused(path, "an interface name is not NUL-terminated"));
      f.interfaces.push_back({n, d->interfaces[i].version});
    }
    if (!f.interfaces.empty() && f.get_interface == nullptr)
      return fail(BALLAST_EFORMAT, refused(path, "lists interfaces but has no get_interface"));
  }
  *out = std::move(f);
  return BALLAST_OK;
}

std::string install_prefix() {
  // The folder holding this code (bin/ for the executable, lib/ for
  // libballast), then its parent. For code in the main executable dladdr
  // reports argv[0], which may be a bare name: use /proc/self/exe then.
  Dl_info info{};
  std::error_code ec;
  fs::path here;
  if (dladdr(reinterpret_cast<void*>(&install_prefix), &info) != 0 && info.dli_fname != nullptr &&
      std::strchr(info.dli_fname, '/') != nullptr) {
    here = fs::absolute(info.dli_fname, ec);
  } else {
    here = fs::read_symlink("/proc/self/exe", ec);
  }
  if (ec || here.empty()) return {};
  return here.parent_path().parent_path().string();
}

std::vector<std::string> plugin_search_path() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("BALLAST_PLUGIN_PATH")) {
    std::string s = env;
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) dirs.push_back(s.substr(start, end - start));
      start = end + 1;
    }
  }
  std::string prefix = install_prefix();
  if (!prefix.empty()) dirs.push_back((fs::path(prefix) / BALLAST_PLUGIN_REL_DIR).string());
  return dirs;
}

std::vector<std::string> plugin_files_in(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".so" && (e.is_regular_file(ec) || e.is_symlink(ec)))
      files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

int resolve_plugin(const std::string& reference, const std::string& base_dir, std::string* path) {
  std::error_code ec;
  fs::path p(reference);
  if (reference.find('/') != std::string::npos || p.extension() == ".so") {
    fs::path full = p.is_absolute() ? p : fs::path(base_dir) / p;
    if (fs::exists(full, ec)) {
      *path = full.string();
      return BALLAST_OK;
    }
    if (reference.find('/') != std::string::npos)
      return fail(BALLAST_ENOTFOUND, "plugin file " + full.string() + " does not exist");
  }
  std::string stem = p.extension() == ".so" ? p.stem().string() : reference;
  std::vector<std::string> names = {stem + ".so"};
  if (stem.rfind("ballast-", 0) != 0) names.push_back("ballast-" + stem + ".so");
  std::string looked;
  for (const auto& dir : plugin_search_path()) {
    for (const auto& n : names) {
      fs::path candidate = fs::path(dir) / n;
      if (fs::exists(candidate, ec)) {
        *path = candidate.string();
        return BALLAST_OK;
      }
    }
    looked += (looked.empty() ? "" : ", ") + dir;
  }
  return fail(BALLAST_ENOTFOUND, "plugin '" + reference + "' not found in " +
                                     (looked.empty() ? std::string("an empty search path") : looked) +
                                     " (set BALLAST_PLUGIN_PATH)");
}

}  // namespace ballast
