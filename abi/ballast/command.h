/* Ballast C ABI: interface "ballast.command" v1, subcommands of `ballast`.
 *
 * A plugin that offers this interface adds subcommands to the `ballast`
 * executable: `ballast NAME ARGS...` finds the plugin offering NAME, creates
 * it (without starting it) and calls run() with the arguments after NAME.
 * This is how `ballast detect`, `ballast whatif`, `ballast plan`, ... are
 * provided by their plugins while the plugins depend on abi/ only. */
#ifndef BALLAST_COMMAND_H
#define BALLAST_COMMAND_H

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BALLAST_COMMAND_INTERFACE "ballast.command"
#define BALLAST_COMMAND_VERSION 1

typedef struct ballast_command {
  const char* name;    /* "whatif" */
  const char* summary; /* one line for `ballast --help` */
  /* Run the command. argv[0] is "ballast NAME"; argv[argc] is NULL. Prints
   * to stdout/stderr itself and returns the process exit code (0 success,
   * 1 failure, 2 usage error). Main thread only. */
  int (*run)(void* state, int argc, char** argv);
} ballast_command;

typedef struct ballast_command_table {
  uint32_t size;  /* sizeof(ballast_command_table) */
  uint32_t count; /* entries in commands */
  const ballast_command* commands;
} ballast_command_table;
#define BALLAST_COMMAND_TABLE_V1_SIZE BALLAST_SIZE_TO(ballast_command_table, commands)

#ifdef __cplusplus
}
#endif

#endif /* BALLAST_COMMAND_H */
