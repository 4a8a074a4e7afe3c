// The plugin loader (DESIGN.md "The C ABI", rules 1-2).
//
// Loading a plugin file: check it is a well-formed ELF shared object whose
// segments lie inside the file (a truncated .so would otherwise raise SIGBUS
// inside dlopen), dlopen it through Boost.DLL with RTLD_NOW|RTLD_LOCAL, find
// `ballast_plugin_v1` and check it is defined in the file itself (not in a
// library it depends on), call it first with the host's ABI minor, then
// validate the descriptor. Plugins are never unloaded: the libraries stay
// mapped for the life of the process (UCX, CUDA and NCCL keep callbacks into
// them), and the loader says so rather than pretend to unload.
#pragma once

#include <ballast/plugin.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ballast {

struct InterfaceName {
  std::string name;
  uint32_t version;
};

// A plugin file that passed every check. `descriptor` points into the
// loaded library, which stays mapped for the life of the process.
struct PluginFile {
  std::string path;  // canonical
  const ballast_plugin_descriptor* descriptor = nullptr;
  uint32_t descriptor_size = 0;
  std::string name, version, kind, description;
  uint32_t abi_major = 0, abi_minor = 0;
  std::vector<InterfaceName> interfaces;  // from the descriptor's optional list

  // The optional descriptor fields, NULL when the plugin's size does not cover them.
  const void* (*get_interface)(void*, const char*, uint32_t) = nullptr;
  bool offers(const char* interface_name, uint32_t version) const;
};

// Load and validate `path`. Status; the message names the file and the reason
// ("plugin /x/libfoo.so refused: descriptor abi_major is 2, this host serves 1").
// Loading the same file twice returns the same descriptor.
int load_plugin_file(const std::string& path, PluginFile* out);

// Checks an ELF shared object without mapping it: header, class, machine,
// type, program and section header tables and every segment inside the file.
// Status; *reason says what is wrong.
int check_elf_file(const std::string& path, std::string* reason);

// Where plugins are looked for, in order: $BALLAST_PLUGIN_PATH (colon
// separated), then the plugin folder next to the running executable or
// library (<prefix>/lib/ballast/plugins).
std::vector<std::string> plugin_search_path();

// The shared objects (*.so) directly inside `dir`, sorted.
std::vector<std::string> plugin_files_in(const std::string& dir);

// Resolve a plugin reference from a config: an existing path (relative to
// `base_dir` when relative), or a name ("hello" or "ballast-hello") looked up
// in the search path. Status; the message lists where it looked.
int resolve_plugin(const std::string& reference, const std::string& base_dir, std::string* path);

// The file of the loaded plugin whose code or data holds `address`, or NULL.
// Async-signal-safe (a crash handler names the plugin with it).
const char* plugin_containing(uintptr_t address);

// <prefix> of the running libballast (the folder above bin/ or lib/).
std::string install_prefix();

}  // namespace ballast
