/* GPUDirect Storage: reads from files straight into GPU memory through libcufile, which is loaded at
 * run time so that builds and machines without it work. The few declarations used are written out
 * here; they follow cufile.h, whose C ABI is stable across releases. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_int.cuh"

namespace {
struct cf_err { /* CUfileError_t: a CUfileOpError (0: success) and a CUresult */
    int err, cu_err;
};
struct cf_descr { /* CUfileDescr_t */
    int type;     /* CU_FILE_HANDLE_TYPE_OPAQUE_FD */
    union {
        int fd;
        void *handle;
    } handle;
    const void *fs_ops;
};
enum { CF_HANDLE_FD = 1 };
} // namespace

struct cu_gds {
    void *lib;
    int state; /* 0: not tried, 1: open, -1: unavailable (why) */
    int direct;
    char why[512];
    cf_err (*driver_open)(void);
    cf_err (*driver_close)(void);
    cf_err (*handle_register)(void **fh, cf_descr *d);
    void (*handle_deregister)(void *fh);
    ssize_t (*read)(void *fh, void *base, size_t size, off_t file_off, off_t base_off);
};

static int gds_start(cu_impl *c, cu_gds *g) {
    const char *names[] = {"libcufile.so.0", "libcufile.so", "/usr/local/cuda/lib64/libcufile.so.0"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !g->lib; i++) g->lib = dlopen(names[i], RTLD_NOW);
    if (!g->lib) {
        snprintf(g->why, sizeof g->why, "libcufile.so.0 (GPUDirect Storage) cannot be loaded: %s", dlerror());
        return -1;
    }
    *(void **)&g->driver_open = dlsym(g->lib, "cuFileDriverOpen");
    *(void **)&g->driver_close = dlsym(g->lib, "cuFileDriverClose_v2");
    if (!g->driver_close) *(void **)&g->driver_close = dlsym(g->lib, "cuFileDriverClose");
    *(void **)&g->handle_register = dlsym(g->lib, "cuFileHandleRegister");
    *(void **)&g->handle_deregister = dlsym(g->lib, "cuFileHandleDeregister");
    *(void **)&g->read = dlsym(g->lib, "cuFileRead");
    if (!g->driver_open || !g->driver_close || !g->handle_register || !g->handle_deregister || !g->read) {
        snprintf(g->why, sizeof g->why, "libcufile.so.0 lacks the cuFile driver, handle or read calls");
        return -1;
    }
    cudaSetDevice(c->dev);
    cf_err r = g->driver_open();
    if (r.err) {
        snprintf(g->why, sizeof g->why,
                 "the cuFile driver does not open (cuFile error %d, CUDA driver error %d); check /etc/cufile.json "
                 "and the nvidia-fs module",
                 r.err, r.cu_err);
        return -1;
    }
    /* without the nvidia-fs module cuFile runs in its compatibility mode: POSIX reads into its own
     * host buffers, then copies */
    g->direct = access("/dev/nvidia-fs0", F_OK) == 0 || access("/proc/driver/nvidia-fs", F_OK) == 0;
    return 0;
}

int cu_gds_open(sl_backend *b, int *direct, sl_err *e) {
    cu_impl *c = cu_of(b);
    if (!c->gds && !(c->gds = (cu_gds *)calloc(1, sizeof *c->gds))) return sl_fail(e, "out of memory");
    cu_gds *g = c->gds;
    if (!g->state) g->state = gds_start(c, g) ? -1 : 1;
    if (g->state < 0) return sl_fail(e, "%s", g->why);
    *direct = g->direct;
    return 0;
}

void *cu_gds_file(sl_backend *b, int fd, sl_err *e) {
    cu_gds *g = cu_of(b)->gds;
    if (!g || g->state != 1) {
        sl_fail(e, "GPUDirect Storage is not open");
        return NULL;
    }
    cf_descr d;
    memset(&d, 0, sizeof d);
    d.type = CF_HANDLE_FD;
    d.handle.fd = fd;
    void *fh = NULL;
    cf_err r = g->handle_register(&fh, &d);
    if (r.err) {
        sl_fail(e, "cuFile does not take the file (cuFile error %d%s; its log, cufile.log, says why)", r.err,
                r.err == 5027 ? ": file descriptor is not registered" : "");
        return NULL;
    }
    return fh;
}

void cu_gds_file_close(sl_backend *b, void *fh) {
    cu_gds *g = cu_of(b)->gds;
    if (g && g->state == 1 && fh) g->handle_deregister(fh);
}

int64_t cu_gds_read(sl_backend *b, void *fh, void *dst, size_t len, uint64_t off) {
    cu_impl *c = cu_of(b);
    cudaSetDevice(c->dev); /* the calling thread's device: cuFile works in the current context */
    ssize_t r = c->gds->read(fh, dst, len, (off_t)off, 0);
    if (r >= 0) return (int64_t)r;
    return r == -1 ? -(int64_t)errno : -(int64_t)EIO; /* -1 sets errno; other codes are cuFile's own */
}

void cu_gds_close(cu_impl *c) {
    cu_gds *g = c->gds;
    if (!g) return;
    if (g->state == 1) g->driver_close();
    if (g->lib) dlclose(g->lib);
    free(g);
    c->gds = NULL;
}
