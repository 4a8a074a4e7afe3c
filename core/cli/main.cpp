// `ballast`: the command-line host. Built-in subcommands are registered
// here; `ballast NAME` for any other NAME is looked up among the plugins
// offering "ballast.command".
#include <cstdio>

int main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  std::puts("ballast: under construction");
  return 0;
}
