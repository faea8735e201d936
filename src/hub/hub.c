#include "hub/hub.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/util.h"
#include "hub/cache.h"
#include "hub/select.h"

typedef struct hub_buf {
    char *p;
    size_t n;
} hub_buf;

/* One file of the revision. */
typedef struct hub_file {
    const char *name;
    uint64_t size;
    char etag[72]; /* blob name: sha256 of an LFS file, else the git blob sha1 */
    int lfs;
    uint64_t have, got; /* bytes of .incomplete before this run; bytes written in it */
    char inc[4096], blob[4096];
    FILE *f;
    int lock_fd, locked; /* .locks/models--ORG--NAME/ETAG.lock, as huggingface_hub locks a blob */
    CURL *h;
    struct curl_slist *hdr;
    long code;
    int started, bad_range;
    long long range_start;
    char errcode[64];
} hub_file;

typedef struct hub_ctx {
    char ep[512];
    const char *repo, *rev;
    char *token;
    char repo_dir[4096];
    int tty, quiet;
    double t0, last;
    uint64_t total, base; /* bytes the run must fetch, and those already in .incomplete files */
    const char *current;
} hub_ctx;

static size_t buf_write(char *d, size_t sz, size_t nm, void *u) {
    hub_buf *b = u;
    size_t n = sz * nm;
    char *p = realloc(b->p, b->n + n + 1);
    if (!p) return 0;
    memcpy(p + b->n, d, n);
    b->p = p;
    b->n += n;
    p[b->n] = 0;
    return n;
}

/* X-Error-Code names the Hub's reason (RepoNotFound, GatedRepo, ...); Content-Range the resumed offset. */
static size_t header_cb(char *d, size_t sz, size_t nm, void *u) {
    hub_file *f = u;
    size_t n = sz * nm;
    if (n > 13 && !strncasecmp(d, "x-error-code:", 13)) {
        const char *v = d + 13;
        while (*v == ' ') v++;
        snprintf(f->errcode, sizeof f->errcode, "%.*s", (int)strcspn(v, "\r\n"), v);
    } else if (n > 14 && !strncasecmp(d, "content-range:", 14)) {
        long long s = -1;
        if (sscanf(d + 14, " bytes %lld-", &s) == 1) f->range_start = s;
    } else if (n > 5 && !strncasecmp(d, "HTTP/", 5)) {
        f->errcode[0] = 0; /* a new response after a redirect */
        f->range_start = -1;
    }
    return n;
}

static struct curl_slist *base_headers(const hub_ctx *c) {
    char h[4096];
    struct curl_slist *l = curl_slist_append(NULL, "User-Agent: sluice/" SLUICE_VERSION);
    if (c->token) {
        snprintf(h, sizeof h, "Authorization: Bearer %s", c->token);
        l = curl_slist_append(l, h);
    }
    return l;
}

static void setup(CURL *h, const char *url, struct curl_slist *hdr, hub_file *hf) {
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    /* a transfer that stalls for a minute is cut, and can be resumed */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, hf);
}

/* One message for each way the Hub says no. what names the file, or NULL for the repo itself. */
static int http_fail(const hub_ctx *c, long code, const char *xerr, const char *what, sl_err *e) {
    char w[1200];
    snprintf(w, sizeof w, "%s%s%s", c->repo, what ? ": " : "", what ? what : "");
    if (code == 403 || !strcmp(xerr, "GatedRepo"))
        return sl_fail(e,
                       "%s: access refused (%ld): the repo is gated; accept its license at %s/%s with your account, "
                       "then set HF_TOKEN to a token of that account%s",
                       w, code, c->ep, c->repo, c->token ? " (the token given has no access yet)" : "");
    if (code == 401)
        return sl_fail(e,
                       "%s: unauthorized (401): the repo does not exist, or it is private or gated; check the name, "
                       "and %s",
                       w,
                       c->token ? "check that HF_TOKEN is valid and has access to it"
                                : "set HF_TOKEN to a token with access (accepting the license first if it is gated)");
    if (code == 404 && !strcmp(xerr, "RevisionNotFound"))
        return sl_fail(e, "%s: no revision '%s' (404): check the branch, tag or commit", w, c->rev);
    if (code == 404 && !strcmp(xerr, "EntryNotFound")) return sl_fail(e, "%s: no such file at this revision (404)", w);
    if (code == 404)
        return sl_fail(e, "%s: not found on %s (404): check the repo id%s", w, c->ep, what ? "" : " and the revision");
    return sl_fail(e, "%s: the Hub answered HTTP %ld%s%s", w, code, xerr[0] ? ", " : "", xerr);
}

static char *escape(CURL *h, const char *s, int keep_slash) {
    size_t cap = strlen(s) * 3 + 1, n = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    out[0] = 0;
    for (const char *p = s; *p;) {
        size_t seg = keep_slash ? strcspn(p, "/") : strlen(p);
        char *x = curl_easy_escape(h, p, (int)seg);
        if (!x) {
            free(out);
            return NULL;
        }
        n += (size_t)snprintf(out + n, cap - n, "%s%s", x, p[seg] ? "/" : "");
        curl_free(x);
        p += seg + (p[seg] ? 1 : 0);
    }
    return out;
}

/* GET /api/models/REPO/revision/REV?blobs=true: the commit and every file with its size and hashes. */
static int api_info(hub_ctx *c, json_t **out, sl_err *e) {
    CURL *h = curl_easy_init();
    if (!h) return sl_fail(e, "cannot start libcurl");
    hub_buf b = {0};
    hub_file meta = {.range_start = -1};
    char *rev = escape(h, c->rev, 0), url[8192];
    snprintf(url, sizeof url, "%s/api/models/%s/revision/%s?blobs=true", c->ep, c->repo, rev ? rev : "");
    free(rev);
    struct curl_slist *hdr = base_headers(c);
    setup(h, url, hdr, &meta);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 120L);
    CURLcode r = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdr);
    int rc = 0;
    if (r != CURLE_OK)
        rc = sl_fail(e, "%s: cannot reach the Hub at %s: %s", c->repo, c->ep, curl_easy_strerror(r));
    else if (code != 200)
        rc = http_fail(c, code, meta.errcode, NULL, e);
    else {
        json_error_t je;
        *out = json_loadb(b.p ? b.p : "", b.n, 0, &je);
        if (!*out) rc = sl_fail(e, "%s: the Hub's answer from %s is not JSON: %s", c->repo, url, je.text);
    }
    free(b.p);
    return rc;
}

static int hex_ok(const char *s, size_t n) {
    if (strlen(s) != n) return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
    return 1;
}

/* sha256 of the file, or for git (a non-LFS file) sha1 of "blob SIZE\0" + contents. */
static int hash_file(const char *path, int git, uint64_t size, char *hex, sl_err *e) {
    FILE *f = fopen(path, "rb");
    if (!f) return sl_fail(e, "%s: cannot open: %s", path, strerror(errno));
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    int ok = m && EVP_DigestInit_ex(m, git ? EVP_sha1() : EVP_sha256(), NULL);
    if (ok && git) {
        char pre[64];
        int n = snprintf(pre, sizeof pre, "blob %llu", (unsigned long long)size);
        ok = EVP_DigestUpdate(m, pre, (size_t)n + 1);
    }
    static const size_t chunk = 1 << 20;
    unsigned char *buf = malloc(chunk);
    size_t got;
    ok = ok && buf;
    while (ok && (got = fread(buf, 1, chunk, f)) > 0) ok = EVP_DigestUpdate(m, buf, got);
    ok = ok && !ferror(f);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdn = 0;
    ok = ok && EVP_DigestFinal_ex(m, md, &mdn);
    for (unsigned i = 0; ok && i < mdn; i++) sprintf(hex + 2 * i, "%02x", md[i]);
    free(buf);
    EVP_MD_CTX_free(m);
    fclose(f);
    return ok ? 0 : sl_fail(e, "%s: cannot read to check its checksum", path);
}

static void fmt_eta(double s, char *buf, size_t n) {
    if (s < 0 || s > 360000)
        snprintf(buf, n, "--");
    else if (s >= 3600)
        snprintf(buf, n, "%dh%02dm", (int)s / 3600, (int)s / 60 % 60);
    else if (s >= 60)
        snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(buf, n, "%ds", (int)s);
}

/* The bar: bytes done of all, speed of this run, time left, the file moving now. A TTY redraws one line;
 * elsewhere a line every 5 s and one when a file finishes. */
static void progress(hub_ctx *c, uint64_t got, const char *done_file, int final) {
    if (c->quiet) return;
    double now = sl_now();
    if (!final && !done_file && now - c->last < (c->tty ? 0.2 : 5.0)) return;
    c->last = now;
    double dt = now - c->t0, rate = dt > 0 ? (double)got / dt : 0;
    uint64_t done = c->base + got;
    char a[32], b[32], r[32], eta[32];
    fmt_eta(rate > 0 ? (double)(c->total - done) / rate : -1, eta, sizeof eta);
    sl_human_bytes((double)done, a, sizeof a);
    sl_human_bytes((double)c->total, b, sizeof b);
    sl_human_bytes(rate, r, sizeof r);
    const char *name = done_file ? done_file : c->current ? c->current : "";
    if (c->tty) {
        int pct = c->total ? (int)(100.0 * (double)done / (double)c->total) : 100, w = 24, fill = pct * w / 100;
        char bar[32];
        for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
        bar[w] = 0;
        fprintf(stderr, "\r\033[K[%s] %3d%% %s / %s  %s/s  ETA %s  %s%s", bar, pct, a, b, r, final ? "0s" : eta,
                final ? "done" : name, final ? "\n" : "");
    } else if (final) {
        fprintf(stderr, "pull %s: %s / %s, %s/s, done in %.1f s\n", c->repo, a, b, r, dt);
    } else {
        fprintf(stderr, "pull %s: %s / %s, %s/s, ETA %s, %s%s\n", c->repo, a, b, r, eta, name,
                done_file ? " done" : "");
    }
}

static size_t file_write(char *d, size_t sz, size_t nm, void *u) {
    hub_file *f = u;
    size_t n = sz * nm;
    if (!f->started) {
        f->started = 1;
        curl_easy_getinfo(f->h, CURLINFO_RESPONSE_CODE, &f->code);
        if (f->code == 206 && f->range_start != (long long)f->have) {
            f->bad_range = 1;
            return 0;
        }
        if (f->code == 200 && f->have) { /* the server sent it all: start over */
            if (ftruncate(fileno(f->f), 0)) return 0;
            f->have = 0;
        }
    }
    if (f->code != 200 && f->code != 206) return n; /* an error page: not file contents */
    if (fwrite(d, 1, n, f->f) != n) return 0;
    f->got += n;
    return n;
}

/* The lock huggingface_hub takes (filelock: flock on ROOT/.locks/models--ORG--NAME/ETAG.lock), so that two
 * downloads of one blob, by either tool, never write the same .incomplete file. */
static int lock_blob(const hub_ctx *c, hub_file *f, sl_err *e) {
    char dir[4096], path[8192];
    const char *folder = strrchr(c->repo_dir, '/');
    snprintf(dir, sizeof dir, "%.*s/.locks%s", (int)(folder - c->repo_dir), c->repo_dir, folder);
    if (sl_hub_mkdirs(dir, e)) return -1;
    snprintf(path, sizeof path, "%s/%s.lock", dir, f->etag);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return sl_fail(e, "%s: cannot open: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int err = errno;
        close(fd);
        if (err == EWOULDBLOCK)
            return sl_fail(e, "%s: another process is downloading this file (it holds %s); try again when it is done",
                           f->name, path);
        return sl_fail(e, "%s: cannot lock: %s", path, strerror(err));
    }
    f->lock_fd = fd;
    f->locked = 1;
    return 0;
}

static void unlock_blob(hub_file *f) {
    if (f->locked) close(f->lock_fd);
    f->locked = 0;
}

static int start_file(hub_ctx *c, CURLM *m, hub_file *f, sl_err *e) {
    if (lock_blob(c, f, e)) return -1;
    if (!(f->f = fopen(f->inc, "ab"))) return sl_fail(e, "%s: cannot write: %s", f->inc, strerror(errno));
    if (!(f->h = curl_easy_init())) return sl_fail(e, "cannot start libcurl");
    char *name = escape(f->h, f->name, 1), url[8192];
    char commit[128];
    snprintf(commit, sizeof commit, "%s", c->rev);
    snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", c->ep, c->repo, commit, name ? name : "");
    free(name);
    f->hdr = base_headers(c);
    if (f->have) {
        char r[64];
        snprintf(r, sizeof r, "Range: bytes=%llu-", (unsigned long long)f->have);
        f->hdr = curl_slist_append(f->hdr, r);
    }
    f->range_start = -1;
    setup(f->h, url, f->hdr, f);
    curl_easy_setopt(f->h, CURLOPT_WRITEFUNCTION, file_write);
    curl_easy_setopt(f->h, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(f->h, CURLOPT_PRIVATE, f);
    curl_multi_add_handle(m, f->h);
    c->current = f->name;
    return 0;
}

/* A transfer ended: check it, then move .incomplete to its blob name. */
static int finish_file(hub_ctx *c, hub_file *f, CURLcode r, sl_err *e) {
    int closed = fclose(f->f);
    f->f = NULL;
    if (!f->started) curl_easy_getinfo(f->h, CURLINFO_RESPONSE_CODE, &f->code);
    char a[32], b[32];
    struct stat s;
    uint64_t on_disk = stat(f->inc, &s) ? 0 : (uint64_t)s.st_size;
    if (f->bad_range) {
        unlink(f->inc);
        return sl_fail(e,
                       "%s: the server resumed at byte %lld, not %llu; the partial download was removed, run the "
                       "pull again",
                       f->name, f->range_start, (unsigned long long)f->have);
    }
    if (f->code >= 400) return http_fail(c, f->code, f->errcode, f->name, e);
    if (r != CURLE_OK || closed)
        return sl_fail(e, "%s: download cut off at %s of %s (%s); run the pull again to resume", f->name,
                       sl_human_bytes((double)on_disk, a, sizeof a), sl_human_bytes((double)f->size, b, sizeof b),
                       closed ? strerror(errno) : curl_easy_strerror(r));
    if (on_disk != f->size) {
        unlink(f->inc);
        return sl_fail(e, "%s: got %llu bytes, the Hub lists %llu; the download was removed", f->name,
                       (unsigned long long)on_disk, (unsigned long long)f->size);
    }
    char hex[2 * EVP_MAX_MD_SIZE + 1] = "";
    int git = !f->lfs;
    if (f->lfs || hex_ok(f->etag, 40)) {
        if (hash_file(f->inc, git, f->size, hex, e)) return -1;
        if (strcmp(hex, f->etag)) {
            unlink(f->inc);
            return sl_fail(e, "%s: %s mismatch (expected %s, got %s); the download was removed", f->name,
                           git ? "git sha1" : "sha256", f->etag, hex);
        }
    }
    if (rename(f->inc, f->blob)) return sl_fail(e, "%s: cannot rename to %s: %s", f->inc, f->blob, strerror(errno));
    return 0;
}

/* Fetches files[need[0..nn)], par at a time; every failure is reported, the first one in e. */
static int download(hub_ctx *c, hub_file *files, const int *need, int nn, int par, sl_err *e) {
    CURLM *m = curl_multi_init();
    if (!m) return sl_fail(e, "cannot start libcurl");
    int next = 0, active = 0, failed = 0;
    uint64_t got = 0;
    c->t0 = c->last = sl_now();
    while (next < nn || active) {
        while (active < par && next < nn && !failed) {
            hub_file *f = &files[need[next++]];
            sl_err fe;
            if (start_file(c, m, f, &fe)) {
                if (!failed++) *e = fe;
                if (f->f) fclose(f->f);
                f->f = NULL;
                if (f->h) curl_easy_cleanup(f->h);
                f->h = NULL;
                unlock_blob(f);
                continue;
            }
            active++;
        }
        if (!active) break;
        int running;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int q;
        while ((msg = curl_multi_info_read(m, &q))) {
            if (msg->msg != CURLMSG_DONE) continue;
            hub_file *f;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&f);
            CURLcode r = msg->data.result;
            curl_multi_remove_handle(m, f->h);
            sl_err fe;
            int rc = finish_file(c, f, r, &fe);
            curl_easy_cleanup(f->h);
            curl_slist_free_all(f->hdr);
            f->h = NULL;
            f->hdr = NULL;
            unlock_blob(f);
            active--;
            if (rc) {
                /* the first failure is the caller's to report; the others are said here */
                if (!failed++)
                    *e = fe;
                else if (!c->quiet)
                    fprintf(stderr, "%s%s\n", c->tty ? "\r\033[K" : "", fe.msg);
            }
            uint64_t sum = 0;
            for (int i = 0; i < nn; i++) sum += files[need[i]].got;
            got = sum;
            if (!rc) progress(c, got, f->name, 0);
        }
        uint64_t sum = 0;
        for (int i = 0; i < nn; i++) sum += files[need[i]].got;
        got = sum;
        progress(c, got, NULL, 0);
        if (active) curl_multi_poll(m, NULL, 0, 200, NULL);
    }
    curl_multi_cleanup(m);
    if (failed) {
        if (failed > 1) {
            size_t l = strlen(e->msg);
            snprintf(e->msg + l, sizeof e->msg - l, " (and %d more failed)", failed - 1);
        }
        if (c->tty && !c->quiet) fprintf(stderr, "\n");
        return -1;
    }
    progress(c, got, NULL, 1);
    return 0;
}

/* snapshots/COMMIT/NAME -> ../../blobs/ETAG, with one more ../ per folder in NAME, as huggingface_hub links. */
static int link_file(const hub_ctx *c, const char *commit, const hub_file *f, sl_err *e) {
    char link[8192], target[8192], dir[8192];
    snprintf(link, sizeof link, "%s/snapshots/%s/%s", c->repo_dir, commit, f->name);
    snprintf(dir, sizeof dir, "%s", link);
    *strrchr(dir, '/') = 0;
    if (sl_hub_mkdirs(dir, e)) return -1;
    size_t n = 0;
    for (int i = 0; i < 2; i++) n += (size_t)snprintf(target + n, sizeof target - n, "../");
    for (const char *p = f->name; (p = strchr(p, '/')); p++)
        n += (size_t)snprintf(target + n, sizeof target - n, "../");
    snprintf(target + n, sizeof target - n, "blobs/%s", f->etag);
    unlink(link);
    if (symlink(target, link)) return sl_fail(e, "%s: cannot create the link: %s", link, strerror(errno));
    return 0;
}

static int write_ref(const hub_ctx *c, const char *rev, const char *commit, sl_err *e) {
    char path[8192], dir[8192];
    snprintf(path, sizeof path, "%s/refs/%s", c->repo_dir, rev);
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = 0;
    if (sl_hub_mkdirs(dir, e)) return -1;
    return sl_write_file(path, commit, strlen(commit), e);
}

static uint64_t json_u64(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
}

static int pull(hub_ctx *c, const sl_hub_pull_opts *o, json_t *info, char **path, sl_err *e) {
    const char *commit = json_string_value(json_object_get(info, "sha"));
    json_t *sib = json_object_get(info, "siblings");
    if (!commit || !hex_ok(commit, 40) || !json_is_array(sib))
        return sl_fail(e, "%s: the Hub's answer has no commit 'sha' or no 'siblings' list", c->repo);
    int n = (int)json_array_size(sib), rc = -1, *keep = calloc((size_t)n + 1, sizeof *keep),
        *need = calloc((size_t)n + 1, sizeof *need), nn = 0, gguf = -1;
    const char **names = calloc((size_t)n + 1, sizeof *names);
    hub_file *files = calloc((size_t)n + 1, sizeof *files);
    if (!keep || !need || !names || !files) {
        sl_fail(e, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        names[i] = json_string_value(json_object_get(json_array_get(sib, (size_t)i), "rfilename"));
        if (!names[i] || names[i][0] == '/' || strstr(names[i], "..")) {
            sl_fail(e, "%s: the Hub's file list has a bad 'rfilename' at entry %d", c->repo, i);
            goto done;
        }
    }
    if (sl_hub_select(c->repo, names, n, o->select, keep, &gguf, e)) goto done;
    char blobs[8192];
    snprintf(blobs, sizeof blobs, "%s/blobs", c->repo_dir);
    if (sl_hub_mkdirs(blobs, e)) goto done;
    int nkeep = 0;
    for (int i = 0; i < n; i++) {
        if (!keep[i]) continue;
        nkeep++;
        json_t *s = json_array_get(sib, (size_t)i), *lfs = json_object_get(s, "lfs");
        hub_file *f = &files[i];
        f->name = names[i];
        const char *sha = json_string_value(json_object_get(lfs, "sha256")),
                   *blob = json_string_value(json_object_get(s, "blobId"));
        f->lfs = sha != NULL;
        f->size = f->lfs ? json_u64(lfs, "size") : json_u64(s, "size");
        if (!json_object_get(f->lfs ? lfs : s, "size")) {
            sl_fail(e, "%s: the Hub lists no size for %s (the file list needs ?blobs=true)", c->repo, f->name);
            goto done;
        }
        snprintf(f->etag, sizeof f->etag, "%s", f->lfs ? sha : blob ? blob : "");
        if (!(f->lfs ? hex_ok(f->etag, 64) : hex_ok(f->etag, 40))) {
            sl_fail(e, "%s: the Hub lists no %s for %s", c->repo, f->lfs ? "lfs.sha256" : "blobId", f->name);
            goto done;
        }
        snprintf(f->blob, sizeof f->blob, "%s/%s", blobs, f->etag);
        snprintf(f->inc, sizeof f->inc, "%s/%s.incomplete", blobs, f->etag);
        struct stat st;
        if (!stat(f->blob, &st) && (uint64_t)st.st_size == f->size) continue;
        if (!stat(f->inc, &st)) {
            f->have = (uint64_t)st.st_size;
            /* a whole .incomplete file (a run stopped before its check) is fetched again rather than
             * asked for an empty range */
            if (f->have >= f->size) unlink(f->inc), f->have = 0;
        }
        /* a file fetched twice in one list (same content) downloads once */
        int dup = 0;
        for (int k = 0; k < nn; k++) dup |= !strcmp(files[need[k]].etag, f->etag);
        if (dup) continue;
        need[nn++] = i;
        c->total += f->size;
        c->base += f->have;
    }
    struct statvfs vfs;
    uint64_t missing = c->total - c->base;
    if (!statvfs(blobs, &vfs) && missing > (uint64_t)vfs.f_bavail * vfs.f_frsize) {
        char a[32], b[32];
        sl_fail(e, "%s: not enough disk space in %s: the download needs %s more, %s are free", c->repo, c->repo_dir,
                sl_human_bytes((double)missing, a, sizeof a),
                sl_human_bytes((double)vfs.f_bavail * (double)vfs.f_frsize, b, sizeof b));
        goto done;
    }
    if (!o->quiet) {
        char a[32];
        fprintf(stderr, "pulling %s (revision %s, commit %.12s): %d files, %s to fetch%s\n", c->repo, c->rev, commit,
                nkeep, sl_human_bytes((double)missing, a, sizeof a), c->base ? " (resuming)" : "");
    }
    const char *rev = c->rev;
    c->rev = commit; /* files come from the commit the listing named, whatever the branch does meanwhile */
    int dl = download(c, files, need, nn, o->parallel > 0 ? o->parallel : 4, e);
    c->rev = rev;
    if (dl) goto done;
    for (int i = 0; i < n; i++)
        if (keep[i] && link_file(c, commit, &files[i], e)) goto done;
    if (strcmp(rev, commit) && write_ref(c, rev, commit, e)) goto done;
    if (path) {
        char p[8192];
        if (gguf >= 0)
            snprintf(p, sizeof p, "%s/snapshots/%s/%s", c->repo_dir, commit, names[gguf]);
        else
            snprintf(p, sizeof p, "%s/snapshots/%s", c->repo_dir, commit);
        if (!(*path = strdup(p))) {
            sl_fail(e, "out of memory");
            goto done;
        }
    }
    rc = 0;
done:
    free(keep);
    free(need);
    free(names);
    free(files);
    return rc;
}

int sl_hub_pull(const sl_hub_pull_opts *o, char **path, sl_err *e) {
    hub_ctx c = {.repo = o->repo, .rev = o->revision && *o->revision ? o->revision : "main", .quiet = o->quiet};
    if (path) *path = NULL;
    if (sl_hub_repo_dir(o->repo, c.repo_dir, sizeof c.repo_dir, e)) return -1;
    if (strstr(c.rev, "..") || c.rev[0] == '/') return sl_fail(e, "%s: '%s' is not a revision name", o->repo, c.rev);
    const char *ep = getenv("HF_ENDPOINT");
    snprintf(c.ep, sizeof c.ep, "%s", ep && *ep ? ep : "https://huggingface.co");
    for (size_t l = strlen(c.ep); l && c.ep[l - 1] == '/';) c.ep[--l] = 0;
    c.tty = isatty(2);
    c.token = sl_hub_token();
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
        free(c.token);
        return sl_fail(e, "cannot start libcurl");
    }
    json_t *info = NULL;
    int rc = api_info(&c, &info, e) || pull(&c, o, info, path, e) ? -1 : 0;
    json_decref(info);
    free(c.token);
    curl_global_cleanup();
    return rc;
}

int sl_hub_parse_ref(const char *arg, char **repo, char **rev, char **sel, sl_err *e) {
    *repo = *rev = *sel = NULL;
    const char *colon = strchr(arg, ':');
    size_t rl = colon ? (size_t)(colon - arg) : strlen(arg);
    const char *at = memchr(arg, '@', rl);
    *repo = strndup(arg, at ? (size_t)(at - arg) : rl);
    if (at) *rev = strndup(at + 1, rl - (size_t)(at + 1 - arg));
    if (colon) *sel = strdup(colon + 1);
    if (!*repo || (at && !*rev) || (colon && !*sel)) {
        free(*repo), free(*rev), free(*sel);
        *repo = *rev = *sel = NULL;
        return sl_fail(e, "out of memory");
    }
    if ((at && !**rev) || (colon && !**sel)) {
        sl_fail(e, "%s: empty %s (expected ORG/NAME[@REVISION][:QUANT or FILE.gguf])", arg,
                at && !**rev ? "revision after '@'" : "file or quant after ':'");
        free(*repo), free(*rev), free(*sel);
        *repo = *rev = *sel = NULL;
        return -1;
    }
    return 0;
}
