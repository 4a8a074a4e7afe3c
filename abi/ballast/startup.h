/* Ballast C ABI: interface "ballast.startup" v1, start-up services for trainers.
 *
 * Offered by the start-up plugin (ballast-startup.so). A trainer gets the
 * table through get_interface(state, "ballast.startup", 1) and uses it to
 * load checkpoint files with striped parallel reads (one read shared by the
 * processes of a node, if asked) and to time the stages of its start, which
 * are appended to the stage log ($BALLAST_STARTUP_STAGES) and published as
 * `startup.stage` events (events.h). */
#ifndef BALLAST_STARTUP_H
#define BALLAST_STARTUP_H

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BALLAST_STARTUP_INTERFACE "ballast.startup"
#define BALLAST_STARTUP_VERSION 1

enum ballast_startup_load_flags {
  BALLAST_LOAD_DIRECT = 1u << 0,   /* O_DIRECT into a fresh allocation (default without a
                                      destination: mapped, read through the page cache) */
  BALLAST_LOAD_BUFFERED = 1u << 1, /* never O_DIRECT */
  BALLAST_LOAD_SHARE = 1u << 2,    /* one read per node through /dev/shm; the others map it */
  BALLAST_LOAD_NO_VERIFY = 1u << 3 /* ignore the FILE.crc32c checksums */
};

typedef struct ballast_startup_load_options {
  uint32_t size;        /* sizeof(ballast_startup_load_options) */
  uint32_t stripes;     /* parallel readers, 0 = 8 */
  uint64_t chunk_bytes; /* stripe unit, multiple of 4096, 0 = 8 MiB */
  uint32_t flags;       /* enum ballast_startup_load_flags */
  uint32_t reserved;
  void* destination; /* the caller's buffer for the whole file, or NULL: the file is mapped
                        read-only and the stripes read it into the page cache (with DIRECT:
                        the plugin allocates). Page-aligned and a multiple of 4096 long for
                        O_DIRECT. Ignored with SHARE. */
  uint64_t capacity; /* bytes at destination */
} ballast_startup_load_options;
/* Every field after stripes may be left out (0: the default). */
#define BALLAST_STARTUP_LOAD_OPTIONS_V1_SIZE BALLAST_SIZE_TO(ballast_startup_load_options, stripes)

/* One tensor of a safetensors file. Strings and shape live as long as the file. */
typedef struct ballast_startup_tensor {
  const char* name;
  const char* dtype; /* "F32", "BF16", ... */
  uint32_t ndim;
  const int64_t* shape; /* ndim entries */
  uint64_t offset;      /* from the start of the file's bytes (data()) */
  uint64_t bytes;
} ballast_startup_tensor;

/* A loaded file; opaque. */
typedef struct ballast_startup_file ballast_startup_file;

typedef struct ballast_startup_api {
  uint32_t size; /* sizeof(ballast_startup_api) */

  /* Load `path` (a .safetensors file has its header validated; any other is
   * a raw shard) into memory with striped reads, checking FILE.crc32c when it
   * exists. options may be NULL. On success *file is set; free it with
   * release(). On failure a negative status and the message through the host's
   * last_error (or ballast_startup_api.last_error). Any thread. */
  int (*load)(void* state, const char* path, const ballast_startup_load_options* options, ballast_startup_file** file);

  /* The file's bytes (valid until release) and their count. */
  const void* (*data)(const ballast_startup_file* file, uint64_t* bytes);

  /* The file's checksum: CRC-32C over the little-endian CRC-32C of each
   * chunk_bytes chunk (what FILE.crc32c holds as "checksum"). */
  uint32_t (*checksum)(const ballast_startup_file* file);

  /* Tensors of a safetensors file (0 for a raw shard), and the index-th one. */
  uint32_t (*tensor_count)(const ballast_startup_file* file);
  int (*tensor)(const ballast_startup_file* file, uint32_t index, ballast_startup_tensor* out);

  /* Free a loaded file (a shared segment is removed by its last user). NULL is fine. */
  void (*release)(void* state, ballast_startup_file* file);

  /* Record one stage of this process's start ("comm_init", "first_step", ...):
   * appended to the stage log and published as `startup.stage`. Times are
   * wall-clock ns. Any thread. */
  int (*stage)(void* state, const char* stage, int64_t start_ns, int64_t end_ns, uint64_t bytes, int32_t status);

  /* The message of the last failed call of this table on this thread ("" if
   * none); the same text reaches the host's last_error (plugin.h, "Errors"). */
  const char* (*last_error)(void* state);
} ballast_startup_api;
#define BALLAST_STARTUP_API_V1_SIZE BALLAST_SIZE_TO(ballast_startup_api, last_error)

#ifdef __cplusplus
}
#endif

#endif /* BALLAST_STARTUP_H */
