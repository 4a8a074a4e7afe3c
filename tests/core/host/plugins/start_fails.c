/* A plugin whose start() fails, for the host's required and optional
 * plugins. It asks for no config key. */
#include <ballast/plugin.h>

static int dummy;

static int sf_create(const ballast_host_api* host, void** state) {
  (void)host;
  *state = &dummy;
  return BALLAST_OK;
}

static int sf_start(void* state) {
  (void)state;
  return BALLAST_EIO;
}

static void sf_destroy(void* state) { (void)state; }

static const ballast_plugin_descriptor descriptor = {sizeof descriptor,
                                                     BALLAST_ABI_MAJOR,
                                                     BALLAST_ABI_MINOR,
                                                     0,
                                                     "startfails",
                                                     "1.0",
                                                     "test",
                                                     "a plugin whose start fails",
                                                     sf_create,
                                                     sf_start,
                                                     NULL,
                                                     sf_destroy,
                                                     NULL,
                                                     NULL};

BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor) {
  (void)host_minor;
  return &descriptor;
}
