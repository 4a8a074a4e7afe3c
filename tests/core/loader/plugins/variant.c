/* Test plugins for the loader: one source, one behaviour per VARIANT.
 *   GOOD          a valid plugin offering interface "test.echo" v1
 *   OLD_MINOR     descriptor cut after destroy (an older 1.x layout)
 *   NEW_MINOR     abi_minor far ahead, with fields the host does not know
 *   NEW_MAJOR     abi_major 2 in a v1 symbol
 *   SHORT         size smaller than the required prefix
 *   NO_NAME       name NULL
 *   DECLINE       the entry returns NULL (needs a newer host)
 *   CREATE_FAILS  create returns an error with a message
 *   NO_SYMBOL     exports ballast_plugin_v2 only
 *   FOREIGN       does not define the entry itself; a library it links does */
#include <ballast/plugin.h>

#include <stdlib.h>
#include <string.h>

static int created_count;

static int create_ok(const ballast_host_api* host, void** state) {
  (void)host;
  *state = &created_count;
  ++created_count;
  return BALLAST_OK;
}
static int create_fails(const ballast_host_api* host, void** state) {
  (void)state;
  host->set_error(host, "cannot reach the metrics endpoint (test)");
  return BALLAST_EIO;
}
static void destroy(void* state) { (void)state; }

typedef struct echo_v1 {
  uint32_t size;
  int (*echo)(int);
} echo_v1;
static int echo(int x) { return x; }
static const echo_v1 echo_table = {sizeof(echo_v1), echo};
static const void* get_interface(void* state, const char* name, uint32_t version) {
  (void)state;
  if (strcmp(name, "test.echo") == 0 && version == 1) return &echo_table;
  return NULL;
}
static const ballast_interface_info interfaces[] = {{"test.echo", 1}, {NULL, 0}};

#if defined(VARIANT_NEW_MINOR)
/* A plugin built against a future 1.x whose descriptor grew. */
typedef struct future_descriptor {
  ballast_plugin_descriptor base;
  const char* future_field;
  void (*future_callback)(void);
} future_descriptor;
static const future_descriptor descriptor = {
    {sizeof(future_descriptor), 1, 99, 0, "newminor", "1.0", "test", "from the future", create_ok, NULL, NULL, destroy,
     get_interface, interfaces},
    "x",
    NULL};
#define DESCRIPTOR (&descriptor.base)
#else
static ballast_plugin_descriptor descriptor = {sizeof(ballast_plugin_descriptor),
                                               BALLAST_ABI_MAJOR,
                                               BALLAST_ABI_MINOR,
                                               0,
                                               "good",
                                               "1.0",
                                               "test",
                                               "a valid test plugin",
                                               create_ok,
                                               NULL,
                                               NULL,
                                               destroy,
                                               get_interface,
                                               interfaces};
#define DESCRIPTOR (&descriptor)
#endif

#if defined(VARIANT_NO_SYMBOL)
BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v2(uint32_t host_minor) {
  (void)host_minor;
  return DESCRIPTOR;
}
#elif defined(VARIANT_FOREIGN)
/* The entry comes from libforeign_entry.so, which this module links. */
extern const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor);
BALLAST_EXPORT int foreign_anchor(void) { return ballast_plugin_v1(0) != NULL; }
#else
BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor) {
  (void)host_minor;
#if defined(VARIANT_OLD_MINOR)
  descriptor.name = "oldminor";
  descriptor.size = (uint32_t)BALLAST_PLUGIN_DESCRIPTOR_V1_SIZE;
  descriptor.abi_minor = 0;
#elif defined(VARIANT_NEW_MAJOR)
  descriptor.name = "newmajor";
  descriptor.abi_major = 2;
#elif defined(VARIANT_SHORT)
  descriptor.name = "short";
  descriptor.size = 16;
#elif defined(VARIANT_NO_NAME)
  descriptor.name = NULL;
#elif defined(VARIANT_DECLINE)
  return NULL;
#elif defined(VARIANT_CREATE_FAILS)
  descriptor.name = "createfails";
  descriptor.create = create_fails;
#endif
  return DESCRIPTOR;
}
#endif
