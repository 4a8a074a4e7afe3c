/* A plain shared library that exports ballast_plugin_v1: a plugin that links
 * it must be refused, since the entry is not the plugin's own. */
#include <ballast/plugin.h>
#include <stddef.h>

BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor) {
  (void)host_minor;
  return NULL;
}
