/* LD_PRELOAD interposer used by `ballast startup record`: logs every read of a
 * regular file (read, pread, readv, preadv, their fortified forms, and file
 * mmaps) as one text line to the file named by BALLAST_STARTUP_RECORD:
 *
 *   <CLOCK_MONOTONIC ns> \t <dev> \t <ino> \t <offset> \t <length> \t <path> \n
 *
 * Each line is one write(2) to an O_APPEND descriptor, so lines from several
 * processes and threads never interleave and nothing is lost when a process
 * exec()s or is killed. CLOCK_MONOTONIC is system-wide, so lines of several
 * processes sort into one first-need order. Not seen: reads made inside libc
 * (fread/fgets through stdio) and the dynamic loader's own mmaps. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_FDS 4096

/* Per descriptor: 0 = unknown, 1 = a regular file (path cached), 2 = not one. */
typedef struct fd_entry {
  int kind;
  dev_t dev;
  ino_t ino;
  char path[512];
} fd_entry;

static fd_entry g_fds[MAX_FDS];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_out = -1;
static dev_t g_out_dev;
static ino_t g_out_ino;
static __thread int t_inside; /* our own calls must not be traced */

static ssize_t (*real_read)(int, void*, size_t);
static ssize_t (*real_pread)(int, void*, size_t, off_t);
static ssize_t (*real_pread64)(int, void*, size_t, off_t);
static ssize_t (*real_readv)(int, const struct iovec*, int);
static ssize_t (*real_preadv)(int, const struct iovec*, int, off_t);
static ssize_t (*real_preadv64)(int, const struct iovec*, int, off_t);
static void* (*real_mmap)(void*, size_t, int, int, int, off_t);
static void* (*real_mmap64)(void*, size_t, int, int, int, off_t);
static int (*real_close)(int);

static void resolve(void) {
  real_read = dlsym(RTLD_NEXT, "read");
  real_pread = dlsym(RTLD_NEXT, "pread");
  real_pread64 = dlsym(RTLD_NEXT, "pread64");
  real_readv = dlsym(RTLD_NEXT, "readv");
  real_preadv = dlsym(RTLD_NEXT, "preadv");
  real_preadv64 = dlsym(RTLD_NEXT, "preadv64");
  real_mmap = dlsym(RTLD_NEXT, "mmap");
  real_mmap64 = dlsym(RTLD_NEXT, "mmap64");
  real_close = dlsym(RTLD_NEXT, "close");
}

__attribute__((constructor)) static void init(void) { resolve(); }

/* The trace descriptor, checked to still be ours: a job that closes every
 * descriptor and reuses the number must not receive our lines. */
static int out_fd(void) {
  struct stat st;
  if (g_out >= 0 && fstat(g_out, &st) == 0 && st.st_dev == g_out_dev && st.st_ino == g_out_ino) return g_out;
  const char* path = getenv("BALLAST_STARTUP_RECORD");
  if (path == NULL || path[0] == '\0') return -1;
  g_out = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (g_out >= 0 && fstat(g_out, &st) == 0) {
    g_out_dev = st.st_dev;
    g_out_ino = st.st_ino;
  }
  return g_out;
}

static void note(int fd, off_t off, size_t len) {
  if (fd < 0 || len == 0 || t_inside) return;
  t_inside = 1;
  int saved = errno;
  char line[700];
  int n = 0;
  pthread_mutex_lock(&g_lock);
  int out = out_fd();
  if (out >= 0 && fd != out) {
    fd_entry* e = fd < MAX_FDS ? &g_fds[fd] : NULL;
    fd_entry scratch;
    if (e == NULL) {
      scratch.kind = 0;
      e = &scratch;
    }
    struct stat st;
    int have_st = fstat(fd, &st) == 0;
    /* A cached entry is trusted only while the descriptor still names the
     * same file (dup2, close_range and raw syscalls bypass close()). */
    if (e->kind != 0 && (!have_st || st.st_dev != e->dev || st.st_ino != e->ino)) e->kind = 0;
    if (e->kind == 0) {
      char link[64];
      snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
      ssize_t k = readlink(link, e->path, sizeof e->path - 1);
      e->dev = have_st ? st.st_dev : 0;
      e->ino = have_st ? st.st_ino : 0;
      if (have_st && S_ISREG(st.st_mode) && k > 0 && e->path[0] == '/') {
        e->path[k] = '\0';
        e->kind = 1;
      } else {
        e->kind = 2;
      }
    }
    if (e->kind == 1) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      n = snprintf(line, sizeof line, "%lld\t%llu\t%llu\t%lld\t%zu\t%s\n",
                   (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, (unsigned long long)e->dev,
                   (unsigned long long)e->ino, (long long)off, len, e->path);
      if (n > 0 && (size_t)n < sizeof line) {
        if (write(out, line, (size_t)n) < 0 && errno == EBADF) g_out = -1; /* the app closed it */
      }
    }
  }
  pthread_mutex_unlock(&g_lock);
  errno = saved;
  t_inside = 0;
}

static off_t position(int fd) { return (off_t)syscall(SYS_lseek, fd, (off_t)0, SEEK_CUR); }

EXPORT ssize_t read(int fd, void* buf, size_t count) {
  if (!real_read) resolve();
  off_t off = t_inside ? -1 : position(fd);
  ssize_t n = real_read(fd, buf, count);
  if (n > 0 && off >= 0) note(fd, off, (size_t)n);
  return n;
}

EXPORT ssize_t __read_chk(int fd, void* buf, size_t count, size_t buflen) {
  if (count > buflen) abort();
  return read(fd, buf, count);
}

EXPORT ssize_t pread(int fd, void* buf, size_t count, off_t off) {
  if (!real_pread) resolve();
  ssize_t n = real_pread(fd, buf, count, off);
  if (n > 0) note(fd, off, (size_t)n);
  return n;
}

EXPORT ssize_t pread64(int fd, void* buf, size_t count, off_t off) {
  if (!real_pread64) resolve();
  ssize_t n = real_pread64(fd, buf, count, off);
  if (n > 0) note(fd, off, (size_t)n);
  return n;
}

EXPORT ssize_t __pread_chk(int fd, void* buf, size_t count, off_t off, size_t buflen) {
  if (count > buflen) abort();
  return pread(fd, buf, count, off);
}

EXPORT ssize_t __pread64_chk(int fd, void* buf, size_t count, off_t off, size_t buflen) {
  if (count > buflen) abort();
  return pread64(fd, buf, count, off);
}

EXPORT ssize_t readv(int fd, const struct iovec* iov, int cnt) {
  if (!real_readv) resolve();
  off_t off = t_inside ? -1 : position(fd);
  ssize_t n = real_readv(fd, iov, cnt);
  if (n > 0 && off >= 0) note(fd, off, (size_t)n);
  return n;
}

EXPORT ssize_t preadv(int fd, const struct iovec* iov, int cnt, off_t off) {
  if (!real_preadv) resolve();
  ssize_t n = real_preadv(fd, iov, cnt, off);
  if (n > 0) note(fd, off, (size_t)n);
  return n;
}

EXPORT ssize_t preadv64(int fd, const struct iovec* iov, int cnt, off_t off) {
  if (!real_preadv64) resolve();
  ssize_t n = real_preadv64(fd, iov, cnt, off);
  if (n > 0) note(fd, off, (size_t)n);
  return n;
}

/* A file mapping is recorded whole (offset, length) when it is made: the job
 * asked for those pages, and page faults cannot be seen from here. */
EXPORT void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if (!real_mmap) resolve();
  void* p = real_mmap(addr, len, prot, flags, fd, off);
  if (p != MAP_FAILED && !(flags & MAP_ANONYMOUS) && fd >= 0) note(fd, off, len);
  return p;
}

EXPORT void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if (!real_mmap64) resolve();
  void* p = real_mmap64(addr, len, prot, flags, fd, off);
  if (p != MAP_FAILED && !(flags & MAP_ANONYMOUS) && fd >= 0) note(fd, off, len);
  return p;
}

EXPORT int close(int fd) {
  if (!real_close) resolve();
  if (fd >= 0 && fd < MAX_FDS) {
    pthread_mutex_lock(&g_lock);
    g_fds[fd].kind = 0;
    if (fd == g_out) g_out = -1;
    pthread_mutex_unlock(&g_lock);
  }
  return real_close(fd);
}
