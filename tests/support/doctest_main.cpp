// The one main() of every doctest executable (ballast_add_test links it).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
