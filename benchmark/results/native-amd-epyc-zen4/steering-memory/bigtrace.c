/* LD_PRELOAD library: remembers every live C-heap block of 1 MB or more (malloc, posix_memalign,
 * aligned_alloc, memalign) with its call stack; bigtrace_dump(path) writes them, each frame named by
 * dladdr (the nearest exported symbol). Build: gcc -O1 -shared -fPIC -o bigtrace.so bigtrace.c -ldl
 * -lpthread. Valgrind cannot do this here: it has no AVX-512, so oneDNN finds no bfloat16 kernel. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#define MIN_SIZE (1u << 20)
#define SLOTS 65536
#define DEPTH 14
typedef struct { void *p; size_t n; int depth; void *f[DEPTH]; } Entry;
static Entry table[SLOTS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int busy;
static void *(*real_malloc)(size_t);
static void (*real_free)(void *);
static int (*real_pm)(void **, size_t, size_t);
static void *(*real_aa)(size_t, size_t);
static void *(*real_ma)(size_t, size_t);
static void init(void) {
  if (!real_malloc) {
    real_malloc = dlsym(RTLD_NEXT, "malloc"); real_free = dlsym(RTLD_NEXT, "free");
    real_pm = dlsym(RTLD_NEXT, "posix_memalign"); real_aa = dlsym(RTLD_NEXT, "aligned_alloc");
    real_ma = dlsym(RTLD_NEXT, "memalign");
  }
}
static void record(void *p, size_t n) {
  if (!p || n < MIN_SIZE || busy) return;
  busy = 1;
  void *f[DEPTH + 2]; int d = backtrace(f, DEPTH + 2);
  pthread_mutex_lock(&mu);
  for (int i = 0; i < SLOTS; i++) if (!table[i].p) {
    table[i].p = p; table[i].n = n; table[i].depth = d > 2 ? d - 2 : 0;
    memcpy(table[i].f, f + 2, sizeof(void *) * table[i].depth); break; }
  pthread_mutex_unlock(&mu);
  busy = 0;
}
static void forget(void *p) {
  if (!p) return;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < SLOTS; i++) if (table[i].p == p) { table[i].p = 0; break; }
  pthread_mutex_unlock(&mu);
}
void *malloc(size_t n) { init(); void *p = real_malloc(n); record(p, n); return p; }
void free(void *p) { init(); if (p) forget(p); real_free(p); }
int posix_memalign(void **out, size_t a, size_t n) { init(); int r = real_pm(out, a, n); if (!r) record(*out, n); return r; }
void *aligned_alloc(size_t a, size_t n) { init(); void *p = real_aa(a, n); record(p, n); return p; }
void *memalign(size_t a, size_t n) { init(); void *p = real_ma(a, n); record(p, n); return p; }
void bigtrace_dump(const char *path) {
  FILE *o = fopen(path, "w"); busy = 1;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < SLOTS; i++) if (table[i].p) {
    fprintf(o, "ALLOC %zu\n", table[i].n);
    for (int k = 0; k < table[i].depth; k++) {
      Dl_info info; void *a = table[i].f[k];
      if (dladdr(a, &info) && info.dli_fname) {
        const char *base = strrchr(info.dli_fname, '/');
        fprintf(o, "  %s %s+0x%lx\n", base ? base + 1 : info.dli_fname, info.dli_sname ? info.dli_sname : "?",
                (unsigned long)((char *)a - (char *)(info.dli_saddr ? info.dli_saddr : info.dli_fbase)));
      } else fprintf(o, "  ? %p\n", a);
    }
  }
  pthread_mutex_unlock(&mu); busy = 0; fclose(o);
}
