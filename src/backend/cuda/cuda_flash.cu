/* Causal GQA attention of a prompt run on tensor cores (FlashAttention-2 style): a block takes 64
 * consecutive queries of one head, four warps of 16, three blocks a SM for heads of up to 128 (their queries
 * held in registers); where those blocks would leave the GPU's places idle (a short prompt over a long
 * cache) the keys are split in parts, a block a part, and flash_merge_k adds the parts up. Key/value tiles of
 * the sequence's paged cache are staged in shared memory as fp16 rows, two buffers so that the next tile's
 * copy overlaps this tile's products (an f16 cache is copied as it is, by cp.async; f32, bf16 and q8_0 caches are widened and rounded
 * to fp16 on the way); ldmatrix reads both products' fragments, transposing the value tile's. Scores and the weighted
 * values are fp16 MMA with fp32 accumulation, and the softmax is online in fp32 (base 2: the query carries
 * log2(e)). fp16 rather than bf16: scores and probabilities keep three more mantissa bits, and attention
 * inputs stay far inside its range. */
#include <math.h>

#include <type_traits>

#include "backend/cuda/cuda_int.cuh"

#define FA_BQ 64 /* queries per block: 4 warps x 16 rows */

template <typename T> struct fa_args {
    const float *q;
    const T *kc, *vc;
    float *out;
    const float *sinks; /* per head, natural-log units; NULL: none */
    int n_heads, n_kv, window;
    float scale; /* softmax scale x log2(e) */
    cu_bmap bm;
    int t0, n;     /* the run's first token in the batch and its length */
    int qsep;      /* the queries staged apart from the key/value buffers (else in buffer 1 before its first use) */
    int split;     /* keys a block (grid z) when the keys are split between blocks, a multiple of BK; 0: all */
    float *po;     /* split: each block's unscaled outputs [z][n][n_heads * HD] */
    float2 *pml;   /* split: and its rows' running maximum and sum [z][n][n_heads] */
};

__device__ __forceinline__ uint32_t fa_pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* 2^x by the special-function unit alone (inputs <= 0 here; -inf gives 0): exp2f's range checks cost more
 * than the exponent itself in the softmax of every tile */
__device__ __forceinline__ float fa_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t fa_ld32(const __half *p) {
    return *reinterpret_cast<const uint32_t *>(p);
}

/* the A fragment of query rows r0 and r0 + 8, columns 16 kk.. of the staged queries (rows of LQ) */
template <int LQ> __device__ __forceinline__ void fa_qfrag(uint32_t (&A)[4], const __half *sQ, int r0, int kk, int tq) {
    const __half *qa = sQ + r0 * LQ + kk * 16 + 2 * tq;
    A[0] = fa_ld32(qa);
    A[1] = fa_ld32(qa + 8 * LQ);
    A[2] = fa_ld32(qa + 8);
    A[3] = fa_ld32(qa + 8 * LQ + 8);
}

/* the output rows of a lane (r0 and r0 + 8) scaled by c0 and c1 */
template <int HD> __device__ __forceinline__ void fa_rescale(float (&o)[HD / 8][4], float c0, float c1) {
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        o[d][0] *= c0;
        o[d][1] *= c0;
        o[d][2] *= c1;
        o[d][3] *= c1;
    }
}

__device__ __forceinline__ void fa_cp16(void *dst, const void *src, int bytes) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void fa_ldsm4(uint32_t *r, const __half *p) {
    unsigned d = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(d));
}
__device__ __forceinline__ void fa_ldsm4t(uint32_t *r, const __half *p) {
    unsigned d = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(d));
}

/* Three blocks a SM for heads of up to 128 (the queries in registers, 70 KB of shared memory a block) */
template <int HD, int BK, typename T>
__global__ void __launch_bounds__(128, HD <= 128 ? 3 : 1) flash_prefill_k(fa_args<T> a) {
    cu_pdl_enter();
    constexpr int LQ = HD + 8, LK = HD + 8; /* padded rows (16-byte multiples): fragment reads hit distinct banks */
    extern __shared__ __align__(16) unsigned char fa_sm[];
    /* 2 x (K [BK][LK], V [BK][LK]), then the queries [FA_BQ][LQ] unless they go where buffer 1's keys will */
    __half *sKV = reinterpret_cast<__half *>(fa_sm), *sQ = sKV + (a.qsep || HD > 128 ? 4 : 2) * BK * LK;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    int h = blockIdx.y, kvh = h / (a.n_heads / a.n_kv);
    int pos0 = a.bm.pos[a.t0], sq = a.bm.seq[a.t0];
    int i0 = blockIdx.x * FA_BQ;
    long long qw = (long long)a.n_heads * HD, kw = (long long)a.n_kv * HD;
    for (int e = threadIdx.x; e < FA_BQ * HD / 4; e += blockDim.x) {
        int r = e / (HD / 4), d = e % (HD / 4) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i0 + r < a.n) v = *reinterpret_cast<const float4 *>(a.q + (a.t0 + i0 + r) * qw + h * HD + d);
        *reinterpret_cast<__half2 *>(sQ + r * LQ + d) = __floats2half2_rn(v.x * a.scale, v.y * a.scale);
        *reinterpret_cast<__half2 *>(sQ + r * LQ + d + 2) = __floats2half2_rn(v.z * a.scale, v.w * a.scale);
    }
    int r0 = warp * 16 + g;                                                       /* this lane's rows: r0 and r0 + 8 */
    int p0 = pos0 + min(i0 + r0, a.n - 1), p1 = pos0 + min(i0 + r0 + 8, a.n - 1); /* rows past the run: clamped */
    int last = pos0 + min(i0 + FA_BQ, a.n) - 1;
    int first = a.window > 0 ? max(0, pos0 + i0 - a.window + 1) : 0;
    if (a.split) { /* this block's part of the keys (no window: parts start on tile boundaries) */
        first = blockIdx.z * a.split;
        last = min(last, first + a.split - 1);
    }
    /* keys kt .. kt + BK - 1 into buffer b (zero rows past last). A thread copies one column range of every
     * STEP-th row: it divides by the page size once a tile and follows its rows through the pages. */
    const int *pages = a.bm.pages + (long long)sq * a.bm.maxp;
    auto load = [&](int kt, int b) {
        __half *sK = sKV + b * 2 * BK * LK, *sV = sK + BK * LK;
        constexpr int CW = std::is_same<T, __half>::value ? 8 : 4, CPR = HD / CW, STEP = 128 / CPR;
        int j0 = (int)threadIdx.x / CPR, d = (int)threadIdx.x % CPR * CW, t = kt + j0;
        int pi = t / a.bm.psz, off = t - pi * a.bm.psz, page = t <= last ? pages[pi] : 0;
        auto next = [&]() { /* the thread's row STEP positions on */
            t += STEP;
            for (off += STEP; off >= a.bm.psz; off -= a.bm.psz) pi++;
            page = t <= last ? pages[pi] : 0;
        };
        if constexpr (std::is_same<T, __half>::value) {
            for (int j = j0; j < BK; j += STEP, next()) {
                long long row = t <= last ? ((long long)page * a.bm.psz + off) * kw + kvh * HD + d : 0;
                fa_cp16(sK + j * LK + d, a.kc + row, t <= last ? 16 : 0);
                fa_cp16(sV + j * LK + d, a.vc + row, t <= last ? 16 : 0);
            }
            asm volatile("cp.async.commit_group;");
        } else {
            for (int j = j0; j < BK; j += STEP, next()) {
                float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
                if (t <= last) {
                    long long row = ((long long)page * a.bm.psz + off) * kw + kvh * HD + d;
                    kv = cu_kv_get4(a.kc, row);
                    vv = cu_kv_get4(a.vc, row);
                }
                *reinterpret_cast<__half2 *>(sK + j * LK + d) = __floats2half2_rn(kv.x, kv.y);
                *reinterpret_cast<__half2 *>(sK + j * LK + d + 2) = __floats2half2_rn(kv.z, kv.w);
                *reinterpret_cast<__half2 *>(sV + j * LK + d) = __floats2half2_rn(vv.x, vv.y);
                *reinterpret_cast<__half2 *>(sV + j * LK + d + 2) = __floats2half2_rn(vv.z, vv.w);
            }
        }
    };
    /* the lane's query fragments, read from shared memory once (HD 256 reads them each tile: registers) */
    constexpr int QR = HD <= 128 ? HD / 16 : 1;
    uint32_t qf[QR][4];
    if constexpr (HD <= 128) {
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < QR; kk++) fa_qfrag<LQ>(qf[kk], sQ, r0, kk, tq);
        if (!a.qsep) __syncthreads(); /* buffer 1's first keys overwrite the queries */
    }
    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    if (first <= last) load(first, 0);
    for (int kt = first, b = 0; kt <= last; kt += BK, b ^= 1) {
        if (kt + BK <= last) { /* the next tile's copy runs under this tile's products */
            load(kt + BK, b ^ 1);
            if constexpr (std::is_same<T, __half>::value) asm volatile("cp.async.wait_group 1;");
        } else if constexpr (std::is_same<T, __half>::value) {
            asm volatile("cp.async.wait_group 0;");
        }
        __syncthreads();
        const __half *sK = sKV + b * 2 * BK * LK, *sV = sK + BK * LK;
        float s[BK / 8][4];
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t A[4];
            if constexpr (HD <= 128) {
                A[0] = qf[kk][0];
                A[1] = qf[kk][1];
                A[2] = qf[kk][2];
                A[3] = qf[kk][3];
            } else {
                fa_qfrag<LQ>(A, sQ, r0, kk, tq);
            }
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt += 2) { /* key tiles nt and nt + 1 in one ldmatrix */
                uint32_t B[4];
                fa_ldsm4(B, sK + (nt * 8 + (lane & 7) + ((lane >> 4) << 3)) * LK + kk * 16 + ((lane >> 3) & 1) * 8);
                cu_mma_f16(s[nt], A, B);
                cu_mma_f16(s[nt + 1], A, B + 2);
            }
        }
        /* causal and window masks; keys past the block's last query are zero rows, masked too. A tile before
         * the block's first query and inside every query's window needs none (all but the last of a long cache) */
        float mx0 = -INFINITY, mx1 = -INFINITY;
        if (kt + BK - 1 <= min(pos0 + i0, last) && (a.window <= 0 || kt > last - a.window)) {
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++) {
                mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
                mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
            }
        } else {
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    int t = kt + nt * 8 + 2 * tq + c;
                    bool ok0 = t <= p0 && t <= last && (a.window <= 0 || t > p0 - a.window);
                    bool ok1 = t <= p1 && t <= last && (a.window <= 0 || t > p1 - a.window);
                    s[nt][c] = ok0 ? s[nt][c] : -INFINITY;
                    s[nt][2 + c] = ok1 ? s[nt][2 + c] : -INFINITY;
                    mx0 = fmaxf(mx0, s[nt][c]);
                    mx1 = fmaxf(mx1, s[nt][2 + c]);
                }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        float b0 = n0 == -INFINITY ? 0.f : n0, b1 = n1 == -INFINITY ? 0.f : n1; /* rows with nothing yet */
        float c0 = fa_ex2(m0 - b0), c1 = fa_ex2(m1 - b1), rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++) {
            s[nt][0] = fa_ex2(s[nt][0] - b0);
            s[nt][1] = fa_ex2(s[nt][1] - b0);
            s[nt][2] = fa_ex2(s[nt][2] - b1);
            s[nt][3] = fa_ex2(s[nt][3] - b1);
            rs0 += s[nt][0] + s[nt][1];
            rs1 += s[nt][2] + s[nt][3];
        }
        rs0 += __shfl_xor_sync(0xffffffffu, rs0, 1);
        rs0 += __shfl_xor_sync(0xffffffffu, rs0, 2);
        rs1 += __shfl_xor_sync(0xffffffffu, rs1, 1);
        rs1 += __shfl_xor_sync(0xffffffffu, rs1, 2);
        l0 = l0 * c0 + rs0;
        l1 = l1 * c1 + rs1;
        m0 = n0;
        m1 = n1;
        if (__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f)) fa_rescale<HD>(o, c0, c1); /* no row's max moved */
        /* the score fragments are the A fragments of P.V: keys 16kk.. are score tiles 2kk and 2kk+1 */
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t A[4] = {fa_pack(s[2 * kk][0], s[2 * kk][1]), fa_pack(s[2 * kk][2], s[2 * kk][3]),
                             fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int d = 0; d < HD / 8; d += 2) { /* value columns d and d + 1, transposed by ldmatrix */
                uint32_t B[4];
                fa_ldsm4t(B, sV + (kk * 16 + (lane & 15)) * LK + (d + (lane >> 4)) * 8);
                cu_mma_f16(o[d], A, B);
                cu_mma_f16(o[d + 1], A, B + 2);
            }
        }
        __syncthreads(); /* buffer b is refilled by the next tile's copy */
    }
    int q0 = i0 + r0, q1 = q0 + 8;
    if (a.split) { /* unscaled, with each row's maximum and sum: flash_merge_k finishes them */
        long long z = (long long)blockIdx.z * a.n;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            int col = h * HD + d * 8 + 2 * tq;
            if (q0 < a.n) *reinterpret_cast<float2 *>(a.po + (z + q0) * qw + col) = make_float2(o[d][0], o[d][1]);
            if (q1 < a.n) *reinterpret_cast<float2 *>(a.po + (z + q1) * qw + col) = make_float2(o[d][2], o[d][3]);
        }
        if (tq == 0 && q0 < a.n) a.pml[(z + q0) * a.n_heads + h] = make_float2(m0, l0);
        if (tq == 0 && q1 < a.n) a.pml[(z + q1) * a.n_heads + h] = make_float2(m1, l1);
        return;
    }
    if (a.sinks) { /* a sink is one more score in the denominator, with no value */
        float sk = a.sinks[h] * 1.4426950408889634f;
        float n0 = fmaxf(m0, sk), n1 = fmaxf(m1, sk);
        float c0 = exp2f(m0 - n0), c1 = exp2f(m1 - n1);
        l0 = l0 * c0 + exp2f(sk - n0);
        l1 = l1 * c1 + exp2f(sk - n1);
        fa_rescale<HD>(o, c0, c1);
    }
    float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        int col = h * HD + d * 8 + 2 * tq;
        if (q0 < a.n)
            *reinterpret_cast<float2 *>(a.out + (a.t0 + q0) * qw + col) = make_float2(o[d][0] * inv0, o[d][1] * inv0);
        if (q1 < a.n)
            *reinterpret_cast<float2 *>(a.out + (a.t0 + q1) * qw + col) = make_float2(o[d][2] * inv1, o[d][3] * inv1);
    }
}

/* The parts of a split run: out[t][h] = sum_z 2^(m_z - M) o_z / (sum_z 2^(m_z - M) l_z + sink), M the largest
 * maximum (and the sink's score); a grid row per token and head, a thread per column */
__global__ void flash_merge_k(const float *po, const float2 *pml, int parts, int n, int n_heads, int hd,
                              const float *sinks, int t0, float *out) {
    cu_pdl_enter();
    int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    float sk = sinks ? sinks[h] * 1.4426950408889634f : -INFINITY, M = sk;
    for (int z = 0; z < parts; z++) M = fmaxf(M, pml[((long long)z * n + t) * n_heads + h].x);
    float L = sinks ? exp2f(sk - M) : 0.f, acc = 0.f;
    long long qw = (long long)n_heads * hd;
    for (int z = 0; z < parts; z++) {
        float2 ml = pml[((long long)z * n + t) * n_heads + h];
        float w = ml.x > -INFINITY ? exp2f(ml.x - M) : 0.f;
        L += w * ml.y;
        if (d < hd) acc += w * po[((long long)z * n + t) * qw + h * hd + d];
    }
    if (d < hd) out[(long long)(t0 + t) * qw + h * hd + d] = L > 0.f ? acc / L : 0.f;
}

/* How many parts a run's keys are split into: none while the blocks fill the GPU's places twice over, else the
 * count (up to 8, each part 512 keys or more) whose waves of blocks leave the fewest places idle */
static int fa_parts(const cu_impl *c, long long blocks, int places, int keys, int window) {
    if (!c->fa_split || window > 0 || blocks >= 2LL * places || keys < 1024) return 1;
    int best = 1;
    double eff = 0;
    for (int p = 1; p <= 8 && keys / p >= 512; p++) {
        long long b = blocks * p, waves = (b + places - 1) / places;
        double e = (double)b / (double)(waves * places);
        if (e > eff + 0.02) eff = e, best = p;
    }
    return best;
}

template <int HD, int BK, typename T> static int fa_launch(cu_impl *c, fa_args<T> a, int keys) {
    a.qsep = HD > 128 || c->fa_qsep;
    size_t smem = ((size_t)(a.qsep ? FA_BQ * (HD + 8) : 0) + (size_t)4 * BK * (HD + 8)) * sizeof(__half);
    if (smem > (size_t)c->smem_optin ||
        cudaFuncSetAttribute(flash_prefill_k<HD, BK, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess)
        return 0;
    long long blocks = (long long)CU_BLOCKS(a.n, FA_BQ) * a.n_heads;
    int parts = fa_parts(c, blocks, c->sms * cu_occupancy(c, (const void *)flash_prefill_k<HD, BK, T>, 128, smem),
                         keys, a.window);
    if (parts > 1) {
        a.split = ((keys + parts - 1) / parts + BK - 1) / BK * BK;
        parts = (keys + a.split - 1) / a.split;
        size_t po = (size_t)parts * (size_t)a.n * (size_t)a.n_heads * HD;
        if (cu_grow_try(c, (void **)&c->fa_part, &c->fa_part_len, (po + (size_t)parts * a.n * a.n_heads * 2) * 4)) {
            parts = 1; /* no memory for the parts: the keys whole */
            a.split = 0;
        } else {
            a.po = c->fa_part;
            a.pml = reinterpret_cast<float2 *>(c->fa_part + po);
        }
    }
    cu_launch(c, flash_prefill_k<HD, BK, T>, dim3(CU_BLOCKS(a.n, FA_BQ), (unsigned)a.n_heads, (unsigned)parts), 128,
              smem, a);
    if (parts > 1)
        cu_launch(c, flash_merge_k, dim3((unsigned)a.n, (unsigned)a.n_heads), HD, 0, (const float *)a.po,
                  (const float2 *)a.pml, parts, a.n, a.n_heads, HD, a.sinks, a.t0, a.out);
    return 1;
}

template <typename T>
static int flash_t(cu_impl *c, const float *q, const T *kc, const T *vc, const sl_batch_map *bm, int t0, int n,
                   int n_heads, int n_kv, int head_dim, int window, float scale, const float *sinks, float *out) {
    fa_args<T> a = {q,  kc, vc, out, sinks, n_heads, n_kv, window, scale * 1.4426950408889634f, cu_bmap_of(bm), t0, n,
                    0,  0,  NULL, NULL};
    int keys = bm->h_pos ? bm->h_pos[t0] + n : 0; /* the run's keys, where the host knows its positions */
    switch (head_dim) {
    case 64: return fa_launch<64, 64>(c, a, keys);
    case 128: return fa_launch<128, 64>(c, a, keys);
    case 256: return fa_launch<256, 32>(c, a, keys);
    default: return 0;
    }
}

int cu_flash_prefill(cu_impl *c, const float *q, const void *kc, const void *vc, sl_kv_type kt, const sl_batch_map *bm,
                     int t0, int n, int n_heads, int n_kv, int head_dim, int window, float scale, const float *sinks,
                     float *out) {
    int ok = 0;
    cu_kv_dispatch(c, kt, [&](auto *t) {
        using T = typename std::remove_pointer<decltype(t)>::type;
        ok = flash_t<T>(c, q, (const T *)kc, (const T *)vc, bm, t0, n, n_heads, n_kv, head_dim, window, scale, sinks,
                        out);
    });
    return ok;
}
