#include "testutil.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/util.h"
#include "formats/gguf.h"

char *tu_fixture(const char *rel) {
    const char *root = getenv("SLUICE_FIXTURES");
    if (!root) root = "tests/fixtures";
    char *p = sl_path_join(root, rel);
    cr_assert(p);
    return p;
}

char *tu_slurp(const char *path, size_t *len) {
    char *buf;
    sl_err e;
    if (sl_read_file(path, &buf, len, &e) != 0) cr_assert_fail("%s", e.msg);
    return buf;
}

const char *tu_sluice_bin(void) {
    const char *b = getenv("SLUICE_BIN");
    return b ? b : "./sluice";
}

char *tu_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/sluice-test-XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    cr_assert(d, "mkdtemp failed");
    return strdup(d);
}

int tu_valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t l = u[i] < 0x80 ? 1 : (u[i] >> 5) == 6 ? 2 : (u[i] >> 4) == 14 ? 3 : (u[i] >> 3) == 30 ? 4 : 0;
        if (!l || i + l > n) return 0;
        for (size_t j = 1; j < l; j++)
            if ((u[i + j] & 0xc0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

/* Whether the GGUF file at path declares experts (<general.architecture>.expert_count > 0). */
static int gguf_has_experts(const char *path) {
    sl_gguf *g;
    sl_err e;
    if (sl_gguf_open(path, &g, &e)) return 0;
    sl_gguf_str arch;
    int64_t n = 0;
    char key[128];
    if (!sl_gguf_get_str(g, "general.architecture", &arch, &e) && arch.len < 64) {
        snprintf(key, sizeof key, "%.*s.expert_count", (int)arch.len, arch.s);
        if (sl_gguf_get_int(g, key, &n, &e)) n = 0;
    }
    sl_gguf_close(g);
    return n > 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const tu_name *)a)->s, ((const tu_name *)b)->s);
}

/* The scan, into memory from alloc (calloc-like) and release. */
static tu_name *scan(const char *kind, const char *file, int moe_only, size_t *n, void *(*alloc)(size_t, size_t),
                     void (*release)(void *)) {
    *n = 0;
    const char *root = getenv("SLUICE_FIXTURES");
    char dir[4096], path[4096];
    snprintf(dir, sizeof dir, "%s/%s", root ? root : "tests/fixtures", kind);
    DIR *d = opendir(dir);
    if (!d) return NULL;
    tu_name *names = NULL;
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        struct stat st;
        if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof names->s) continue;
        snprintf(path, sizeof path, "%s/%s/%s", dir, de->d_name, file);
        if (stat(path, &st) || !S_ISREG(st.st_mode) || (moe_only && !gguf_has_experts(path))) continue;
        if (*n == cap) {
            tu_name *grown = alloc(cap ? 2 * cap : 16, sizeof *grown);
            if (!grown) break;
            if (names) memcpy(grown, names, *n * sizeof *names);
            if (names) release(names);
            names = grown;
            cap = cap ? 2 * cap : 16;
        }
        snprintf(names[(*n)++].s, sizeof names->s, "%s", de->d_name);
    }
    closedir(d);
    if (*n) qsort(names, *n, sizeof *names, by_name);
    return names;
}

tu_name *tu_fixture_names(const char *kind, const char *file, int moe_only, size_t *n) {
    return scan(kind, file, moe_only, n, cr_calloc, cr_free);
}

void tu_free_names(struct criterion_test_params *crp) {
    if (crp->params) cr_free(crp->params);
}

void tu_expect_fixtures(const char *kind, const char *file, int moe_only, const char *const *want,
                        const char *const *unwanted) {
    size_t n;
    tu_name *names = scan(kind, file, moe_only, &n, calloc, free);
    for (; *want; want++) {
        size_t i = 0;
        while (i < n && strcmp(names[i].s, *want)) i++;
        cr_expect(i < n, "%s/%s not found among the %zu folders found", kind, *want, n);
    }
    for (; unwanted && *unwanted; unwanted++)
        for (size_t i = 0; i < n; i++) cr_expect(strcmp(names[i].s, *unwanted), "%s/%s found", kind, *unwanted);
    free(names);
}

double tu_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

int tu_argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

int tu_on_gpu(void) {
    const char *b = getenv("SLUICE_BACKEND");
    return b && !strcmp(b, "cuda");
}

float tu_frand(unsigned *st) {
    *st = *st * 1103515245u + 12345u;
    return (float)((*st >> 8) & 0xffff) / 65536.0f - 0.5f;
}

void *tu_dev_copy(sl_backend *be, const void *h, size_t bytes) {
    void *d = be->ops->alloc(be, bytes);
    cr_assert_not_null(d);
    be->ops->upload(be, d, h, bytes);
    return d;
}

void tu_map_make(tu_map *m, sl_backend *be, int n, int pos0, int32_t *hpos, int32_t *hseq, int32_t *hpages, int np,
                 int P) {
    for (int i = 0; i < n; i++) hpos[i] = pos0 + i, hseq[i] = 0;
    for (int j = 0; j < np; j++) hpages[j] = np - 1 - j;
    m->be = be;
    m->dpos = tu_dev_copy(be, hpos, (size_t)n * sizeof *hpos);
    m->dseq = tu_dev_copy(be, hseq, (size_t)n * sizeof *hseq);
    m->dpages = tu_dev_copy(be, hpages, (size_t)np * sizeof *hpages);
    m->bm = (sl_batch_map){.n = n,
                           .pos = m->dpos,
                           .seq = m->dseq,
                           .pages = m->dpages,
                           .page_size = P,
                           .max_pages = np,
                           .h_pos = hpos,
                           .h_seq = hseq,
                           .span = pos0 + n};
}

void tu_map_free(tu_map *m) {
    m->be->ops->free(m->be, m->dpos);
    m->be->ops->free(m->be, m->dseq);
    m->be->ops->free(m->be, m->dpages);
}
