/* Hostile plugins for discovery: one source, one defect per VARIANT.
 *   CREATE_NULL   create() dereferences NULL
 *   CREATE_HANG   create() never returns
 *   CREATE_EXIT   create() calls _exit(0)
 *   HUGE_TABLE    a "ballast.command" table of 4 billion NULL commands
 *   BAD_STRING    a descriptor string pointing to unmapped memory
 *   CONSTRUCTOR   an ELF constructor writes $HOSTILE_MARK (runs on dlopen)
 * Each offers "ballast.command", so command discovery creates it. */
#include <ballast/command.h>
#include <ballast/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int state_word;

static int create(const ballast_host_api* host, void** state) {
  (void)host;
#if defined(VARIANT_CREATE_NULL)
  *(volatile int*)(uintptr_t)0 = 1;
#elif defined(VARIANT_CREATE_HANG)
  for (;;) pause();
#elif defined(VARIANT_CREATE_EXIT)
  _exit(0);
#endif
  *state = &state_word;
  return BALLAST_OK;
}
static void destroy(void* state) { (void)state; }

static int run(void* state, int argc, char** argv) {
  (void)state;
  (void)argc;
  (void)argv;
  return 0;
}
static const ballast_command commands[] = {{"hostile", "a hostile test command", run}};
#if defined(VARIANT_HUGE_TABLE)
static const ballast_command_table table = {sizeof(ballast_command_table), 0xFFFFFFFFu, NULL};
#else
static const ballast_command_table table = {sizeof(ballast_command_table), 1, commands};
#endif

static const void* get_interface(void* state, const char* name, uint32_t version) {
  (void)state;
  if (strcmp(name, BALLAST_COMMAND_INTERFACE) == 0 && version == BALLAST_COMMAND_VERSION) return &table;
  return NULL;
}
static const ballast_interface_info interfaces[] = {{BALLAST_COMMAND_INTERFACE, BALLAST_COMMAND_VERSION}, {NULL, 0}};

static ballast_plugin_descriptor descriptor = {sizeof(ballast_plugin_descriptor),
                                               BALLAST_ABI_MAJOR,
                                               BALLAST_ABI_MINOR,
                                               0,
                                               "hostile",
                                               "1.0",
                                               "test",
                                               "a hostile test plugin",
                                               create,
                                               NULL,
                                               NULL,
                                               destroy,
                                               get_interface,
                                               interfaces};

#if defined(VARIANT_CONSTRUCTOR)
__attribute__((constructor)) static void on_load(void) {
  const char* mark = getenv("HOSTILE_MARK");
  if (mark) {
    FILE* f = fopen(mark, "a");
    if (f) {
      fprintf(f, "%d\n", (int)getpid());
      fclose(f);
    }
  }
}
#endif

BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor) {
  (void)host_minor;
#if defined(VARIANT_BAD_STRING)
  descriptor.description = (const char*)(uintptr_t)0x10;
#endif
  return &descriptor;
}
