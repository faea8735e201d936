#include "core/util.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int sl_read_stream(FILE *f, const char *name, char **out, size_t *len, sl_err *e) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) return sl_fail(e, "%s: out of memory", name);
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                return sl_fail(e, "%s: out of memory", name);
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return sl_fail(e, "%s: read error", name);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

int sl_read_file(const char *path, char **out, size_t *len, sl_err *e) {
    FILE *f = fopen(path, "rb");
    if (!f) return sl_fail(e, "%s: cannot open: %s", path, strerror(errno));
    int rc = sl_read_stream(f, path, out, len, e);
    fclose(f);
    return rc;
}

int sl_write_file(const char *path, const void *data, size_t len, sl_err *e) {
    FILE *f = fopen(path, "wb");
    if (!f) return sl_fail(e, "%s: cannot create: %s", path, strerror(errno));
    size_t w = fwrite(data, 1, len, f);
    int bad = (w != len) | (fclose(f) != 0);
    if (bad) return sl_fail(e, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

int sl_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int sl_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *sl_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

const char *sl_human_bytes(double bytes, char *buf, size_t n) {
    static const char *units[] = {"B", "KB", "MB", "GB", "TB"};
    int u = 0;
    while (bytes >= 1000.0 && u < 4) {
        bytes /= 1000.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%.0f B", bytes);
    else
        snprintf(buf, n, "%.2f %s", bytes, units[u]);
    return buf;
}

const char *sl_human_count(double v, char *buf, size_t len) {
    if (v >= 1e9)
        snprintf(buf, len, "%.2f B", v / 1e9);
    else if (v >= 1e6)
        snprintf(buf, len, "%.2f M", v / 1e6);
    else if (v >= 1e3)
        snprintf(buf, len, "%.2f K", v / 1e3);
    else
        snprintf(buf, len, "%.0f", v);
    return buf;
}

int sl_parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0) return -1;
    while (isspace((unsigned char)*end)) end++;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K':
        mul = 1024.0;
        end++;
        break;
    case 'M':
        mul = 1024.0 * 1024;
        end++;
        break;
    case 'G':
        mul = 1024.0 * 1024 * 1024;
        end++;
        break;
    case 'T':
        mul = 1024.0 * 1024 * 1024 * 1024;
        end++;
        break;
    default: return -1;
    }
    if (toupper((unsigned char)*end) == 'I') end++;
    if (toupper((unsigned char)*end) == 'B') end++;
    if (*end) return -1;
    *out = (uint64_t)(v * mul);
    return 0;
}

uint64_t sl_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int sl_parse_ids(const char *s, int32_t **ids, int *n, sl_err *e) {
    int cap = 16, k = 0;
    int32_t *a = malloc(sizeof *a * (size_t)cap);
    if (!a) return sl_fail(e, "out of memory");
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            free(a);
            return sl_fail(e, "bad token id list '%s': expected comma-separated non-negative integers", s);
        }
        if (k == cap) {
            cap *= 2;
            int32_t *na = realloc(a, sizeof *a * (size_t)cap);
            if (!na) {
                free(a);
                return sl_fail(e, "out of memory");
            }
            a = na;
        }
        a[k++] = (int32_t)v;
        p = end;
    }
    *ids = a;
    *n = k;
    return 0;
}

double sl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double sl_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 8e9;
    char line[256];
    double kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb > 0 ? kb * 1024 : 8e9;
}
