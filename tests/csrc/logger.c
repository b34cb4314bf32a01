/* A stand-in for NCCL's ncclDebugLog: formats each line and keeps it for the harness. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char *lines = NULL;
static size_t len = 0, cap = 0;

void harness_logger(int level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  char row[2200];
  int m = snprintf(row, sizeof row, "%d %#lx %s:%d %s\n", level, flags, file ? file : "?", line, msg);
  if (m < 0) return;
  if ((size_t)m >= sizeof row) m = sizeof row - 1;
  if (getenv("HARNESS_LOG_STDERR")) fputs(row, stderr);
  pthread_mutex_lock(&lock);
  if (len + (size_t)m + 1 > cap) {
    size_t ncap = (cap ? cap * 2 : 65536) + (size_t)m;
    char *p = realloc(lines, ncap);
    if (!p) { pthread_mutex_unlock(&lock); return; }
    lines = p;
    cap = ncap;
  }
  memcpy(lines + len, row, (size_t)m);
  len += (size_t)m;
  lines[len] = 0;
  pthread_mutex_unlock(&lock);
}

/* Copies the log so far into out (NUL-terminated, truncated to cap); returns its full length. */
size_t harness_log_copy(char *out, size_t cap_out) {
  pthread_mutex_lock(&lock);
  size_t n = len;
  if (out && cap_out) {
    size_t k = n < cap_out - 1 ? n : cap_out - 1;
    if (k) memcpy(out, lines, k);
    out[k] = 0;
  }
  pthread_mutex_unlock(&lock);
  return n;
}
