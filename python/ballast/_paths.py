"""Where the installed libballast and its plugins are. `cmake --install`
rewrites this file with the install tree's paths; in the source tree both
are None and BALLAST_LIB / BALLAST_PLUGIN_DIR say where they are."""
LIBDIR = None
PLUGINDIR = None
