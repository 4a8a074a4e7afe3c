/* Ballast C ABI: status codes, versions and export macros.
 *
 * Every ABI function returns an int: 0 (BALLAST_OK) or a negative BALLAST_E*
 * code. The message of the last failure is kept per thread and read with
 * ballast_host_api.last_error (plugins) or ballast_last_error (embedders):
 * plugin.h, "Errors". C99; no C++ type ever crosses this boundary. */
#ifndef BALLAST_STATUS_H
#define BALLAST_STATUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The major version is part of the entry symbol's name (ballast_plugin_v1);
 * the minor version grows when structs grow at their end. */
#define BALLAST_ABI_MAJOR 1
#define BALLAST_ABI_MINOR 2

/* Sizes (the one rule for every struct and table that starts with a uint32_t
 * size): a struct only grows at its end, and each has a v1 minimum size,
 * BALLAST_<NAME>_V1_SIZE, the end of the fields every 1.x reader needs.
 * A reader accepts any size at least the v1 minimum (a larger one comes from
 * a newer minor: the fields it does not know are ignored) and reads a field
 * only when `size` covers it; a field `size` does not cover takes its
 * documented default (0, NULL, or "not given"). BALLAST_SIZE_TO is how both
 * are written: the size of `type` up to and including `field`. */
#define BALLAST_SIZE_TO(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))
#define BALLAST_COVERS(size, type, field) ((size) >= BALLAST_SIZE_TO(type, field))

#if defined(_WIN32)
#define BALLAST_EXPORT __declspec(dllexport)
#else
#define BALLAST_EXPORT __attribute__((visibility("default")))
#endif

enum ballast_status {
  BALLAST_OK = 0,
  BALLAST_EINVAL = -1,     /* an argument or a field is invalid */
  BALLAST_ENOMEM = -2,     /* an allocation failed or a memory cap was hit */
  BALLAST_ENOTFOUND = -3,  /* no such topic, key, plugin, interface or file */
  BALLAST_EVERSION = -4,   /* an ABI or format version this side cannot serve */
  BALLAST_EFULL = -5,      /* a bounded queue is full (lossy subscriber: dropped) */
  BALLAST_ETIMEDOUT = -6,  /* a deadline passed */
  BALLAST_EIO = -7,        /* an operating-system or device I/O failure */
  BALLAST_ESTATE = -8,     /* called in the wrong state (before start, after stop) */
  BALLAST_EABORTED = -9,   /* the operation was aborted */
  BALLAST_EPEER = -10,     /* a peer process failed or disconnected */
  BALLAST_EFORMAT = -11,   /* malformed input: a frame, a file, a descriptor */
  BALLAST_ENOSYS = -12,    /* optional function not provided */
  BALLAST_EINTERNAL = -13, /* a bug: an invariant did not hold */
  BALLAST_EPLUGIN = -14,   /* a plugin callback failed */
  BALLAST_EFENCED = -15    /* 1.2: this process may not act: it is not, or no longer, the leader */
};

/* The short, stable name of a status code ("BALLAST_EINVAL"); never NULL.
 * Header-only so that plugins need not link anything; any thread. */
static inline const char* ballast_status_name(int status) {
  switch (status) {
    case BALLAST_OK:
      return "BALLAST_OK";
    case BALLAST_EINVAL:
      return "BALLAST_EINVAL";
    case BALLAST_ENOMEM:
      return "BALLAST_ENOMEM";
    case BALLAST_ENOTFOUND:
      return "BALLAST_ENOTFOUND";
    case BALLAST_EVERSION:
      return "BALLAST_EVERSION";
    case BALLAST_EFULL:
      return "BALLAST_EFULL";
    case BALLAST_ETIMEDOUT:
      return "BALLAST_ETIMEDOUT";
    case BALLAST_EIO:
      return "BALLAST_EIO";
    case BALLAST_ESTATE:
      return "BALLAST_ESTATE";
    case BALLAST_EABORTED:
      return "BALLAST_EABORTED";
    case BALLAST_EPEER:
      return "BALLAST_EPEER";
    case BALLAST_EFORMAT:
      return "BALLAST_EFORMAT";
    case BALLAST_ENOSYS:
      return "BALLAST_ENOSYS";
    case BALLAST_EINTERNAL:
      return "BALLAST_EINTERNAL";
    case BALLAST_EPLUGIN:
      return "BALLAST_EPLUGIN";
    case BALLAST_EFENCED:
      return "BALLAST_EFENCED";
    default:
      return "BALLAST_E(unknown)";
  }
}

#ifdef __cplusplus
}
#endif

#endif /* BALLAST_STATUS_H */
