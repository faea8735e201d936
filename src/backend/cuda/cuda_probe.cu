/* Physical bounds of the GPU for `sluice bench`, measured once and cached: memory bandwidth from a
 * device-to-device copy (bytes read plus bytes written per second, what HBM sustains), and the bf16
 * tensor-core rate from one large cuBLAS GEMM, the instruction mix prefill uses. */
#include "backend/cuda/cuda_int.cuh"

#define COPY_BYTES ((size_t)1 << 30)
#define GEMM_N 8192

/* best of `reps` timings of fn on the backend's stream, in seconds; 0 when something fails */
template <class F> static double best_time(cu_impl *c, int reps, F fn) {
    cudaEvent_t a, b;
    if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess) return 0;
    double best = 1e30;
    fn(); /* warm-up */
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(a, c->st);
        if (!fn()) best = 0;
        cudaEventRecord(b, c->st);
        float ms = 0;
        if (cudaEventSynchronize(b) != cudaSuccess || cudaEventElapsedTime(&ms, a, b) != cudaSuccess) best = 0;
        if (best > 0 && ms / 1e3 < best) best = ms / 1e3;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best < 1e30 ? best : 0;
}

double cu_mem_bandwidth(sl_backend *b) {
    cu_impl *c = cu_of(b);
    if (c->bandwidth > 0) return c->bandwidth;
    void *src = NULL, *dst = NULL;
    if (cudaMalloc(&src, COPY_BYTES) == cudaSuccess && cudaMalloc(&dst, COPY_BYTES) == cudaSuccess) {
        cudaMemsetAsync(src, 1, COPY_BYTES, c->st);
        double t = best_time(c, 5, [&] {
            return cudaMemcpyAsync(dst, src, COPY_BYTES, cudaMemcpyDeviceToDevice, c->st) == cudaSuccess;
        });
        c->bandwidth = t > 0 ? 2.0 * (double)COPY_BYTES / t : 0;
    }
    cudaGetLastError();
    cudaFree(src);
    cudaFree(dst);
    return c->bandwidth;
}

double cu_peak_flops(sl_backend *b) {
    cu_impl *c = cu_of(b);
    if (c->flops > 0) return c->flops;
    size_t bytes = (size_t)GEMM_N * GEMM_N * 2;
    void *a = NULL, *m = NULL, *y = NULL;
    if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&m, bytes) == cudaSuccess &&
        cudaMalloc(&y, bytes * 2) == cudaSuccess) {
        cudaMemsetAsync(a, 0, bytes, c->st);
        cudaMemsetAsync(m, 0, bytes, c->st);
        const float one = 1.0f, zero = 0.0f;
        double t = best_time(c, 3, [&] {
            return cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, GEMM_N, GEMM_N, GEMM_N, &one, a, CUDA_R_16BF,
                                GEMM_N, m, CUDA_R_16BF, GEMM_N, &zero, y, CUDA_R_32F, GEMM_N, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
        });
        c->flops = t > 0 ? 2.0 * GEMM_N * (double)GEMM_N * GEMM_N / t : 0;
    }
    cudaGetLastError();
    cudaFree(a);
    cudaFree(m);
    cudaFree(y);
    return c->flops;
}
