#include <criterion/criterion.h>
#include <math.h>
#include <stdatomic.h>

#include "core/half.h"
#include "core/pool.h"
#include "core/util.h"

Test(half, bf16_round_trip) {
    cr_assert_eq(sl_bf16_to_f32(0x3f80), 1.0f);
    cr_assert_eq(sl_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(sl_bf16_to_f32(sl_f32_to_bf16(-2.5f)), -2.5f);
    /* 1 + 2^-8 is exactly half way between two bf16 values: rounds to even (1.0). */
    cr_assert_eq(sl_f32_to_bf16(1.0f + 1.0f / 256.0f), 0x3f80);
}

Test(half, f16_values) {
    cr_assert_eq(sl_f16_to_f32(0x3c00), 1.0f);
    cr_assert_eq(sl_f16_to_f32(0xc000), -2.0f);
    cr_assert_eq(sl_f16_to_f32(0x0001), ldexpf(1.0f, -24)); /* smallest subnormal */
    cr_assert(isinf(sl_f16_to_f32(0x7c00)));
    for (int i = 0; i < 0x7c00; i += 7) cr_assert_eq(sl_f32_to_f16(sl_f16_to_f32((uint16_t)i)), i);
}

static void sum_fn(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    atomic_llong *s = ctx;
    for (int64_t i = b; i < e; i++) atomic_fetch_add(s, i);
}

Test(pool, covers_every_item_once) {
    sl_pool *p = sl_pool_create(4);
    cr_assert(p);
    for (int rep = 0; rep < 50; rep++) {
        atomic_llong s = 0;
        sl_pool_for(p, 10007, 1, sum_fn, &s);
        cr_assert_eq(s, 10007LL * 10006 / 2);
    }
    sl_pool_destroy(p);
}

Test(util, parse_size) {
    uint64_t v;
    cr_assert_eq(sl_parse_size("20G", &v), 0);
    cr_assert_eq(v, 20ULL << 30);
    cr_assert_eq(sl_parse_size("512MiB", &v), 0);
    cr_assert_eq(v, 512ULL << 20);
    cr_assert_eq(sl_parse_size("4096", &v), 0);
    cr_assert_eq(v, 4096);
    cr_assert_neq(sl_parse_size("12X", &v), 0);
    cr_assert_neq(sl_parse_size("", &v), 0);
}

Test(util, parse_ids) {
    int32_t *ids;
    int n;
    sl_err e;
    cr_assert_eq(sl_parse_ids("1,2, 30", &ids, &n, &e), 0);
    cr_assert_eq(n, 3);
    cr_assert_eq(ids[2], 30);
    free(ids);
    cr_assert_neq(sl_parse_ids("1,x", &ids, &n, &e), 0);
    cr_assert(strstr(e.msg, "1,x"));
}
