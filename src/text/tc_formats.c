/* Tool-call bodies of GLM-4.5/4.6, DeepSeek-V3/V3.1/R1 and Kimi-K2 (see toolcall.h for their forms). */
#include <stdlib.h>
#include <string.h>

#include "text/tc_int.h"

/* A function name: trimmed, non-empty, on one line and free of markup. NULL when not one. */
static char *name_dup(const char *s, size_t n) {
    tc_trim(&s, &n);
    if (!n || memchr(s, '\n', n) || memchr(s, '<', n)) return NULL;
    return strndup(s, n);
}

/* Fills name and args from a name and the text of its JSON arguments; frees nothing on success. */
static int name_and_json(const char *nm, size_t nl, const char *a, size_t al, char **name, char **args) {
    *name = name_dup(nm, nl);
    if (!*name) return -1;
    if (tc_json_args(a, al, args) != 0) {
        free(*name);
        *name = NULL;
        return -1;
    }
    return 0;
}

/* GLM: NAME (<arg_key>K</arg_key> <arg_value>V</arg_value>)*. A missing </arg_value> is tolerated: the
 * value then ends at the next <arg_key> or the end. */
int tc_body_glm(const sl_tc_parser *p, const char *s, size_t n, char **name, char **args) {
    static const char KO[] = "<arg_key>", KC[] = "</arg_key>", VO[] = "<arg_value>", VC[] = "</arg_value>";
    tc_trim(&s, &n);
    if (n && s[0] == '{') return tc_parse_hermes(s, n, name, args);
    size_t at = tc_find(s, n, KO);
    char *fname = name_dup(s, at);
    json_t *obj = json_object();
    if (!fname || !obj) goto fail;
    s += at, n -= at;
    for (;;) {
        tc_trim(&s, &n);
        if (n == 0) break;
        if (!tc_starts(s, n, KO)) goto fail;
        s += strlen(KO), n -= strlen(KO);
        size_t kl = tc_find(s, n, KC);
        if (kl == n) goto fail;
        const char *k = s;
        s += kl + strlen(KC), n -= kl + strlen(KC);
        tc_trim(&k, &kl);
        tc_trim(&s, &n);
        if (!kl || !tc_starts(s, n, VO)) goto fail;
        s += strlen(VO), n -= strlen(VO);
        size_t vl = tc_find(s, n, VC), next = tc_find(s, n, KO);
        const char *v = s;
        if (next < vl) vl = next;
        size_t skip = tc_starts(s + vl, n - vl, VC) ? strlen(VC) : 0;
        s += vl + skip, n -= vl + skip;
        if (tc_set_param(p, obj, fname, k, kl, v, vl)) goto fail;
    }
    return tc_finish_call(obj, fname, name, args);
fail:
    free(fname);
    json_decref(obj);
    return -1;
}

/* DeepSeek: V3.1 "NAME<｜tool▁sep｜>{args}", or V3/R1 "TYPE<｜tool▁sep｜>NAME\n```json\n{args}\n```". */
int tc_body_deepseek(const sl_tc_parser *p, const char *s, size_t n, char **name, char **args) {
    static const char SEP[] = "<｜tool▁sep｜>";
    (void)p;
    size_t k = tc_find(s, n, SEP);
    if (k == n) return -1;
    const char *r = s + k + strlen(SEP);
    size_t rn = n - k - strlen(SEP);
    tc_trim(&r, &rn);
    if (rn && (r[0] == '{' || r[0] == '"')) return name_and_json(s, k, r, rn, name, args);
    size_t nl = tc_find(r, rn, "\n");
    const char *a = r + nl;
    size_t an = rn - nl;
    tc_trim(&a, &an);
    if (tc_starts(a, an, "```json"))
        a += 7, an -= 7;
    else if (tc_starts(a, an, "```"))
        a += 3, an -= 3;
    if (an >= 3 && memcmp(a + an - 3, "```", 3) == 0) an -= 3;
    return name_and_json(r, nl, a, an, name, args);
}

/* Kimi: "functions.NAME:IDX<|tool_call_argument_begin|>{args}"; the call id gives the name. */
int tc_body_kimi(const sl_tc_parser *p, const char *s, size_t n, char **name, char **args) {
    static const char ARG[] = "<|tool_call_argument_begin|>";
    (void)p;
    size_t k = tc_find(s, n, ARG);
    if (k == n) return -1;
    const char *id = s;
    size_t il = k;
    tc_trim(&id, &il);
    if (tc_starts(id, il, "functions.")) id += 10, il -= 10;
    size_t colon = il;
    while (colon > 0 && id[colon - 1] >= '0' && id[colon - 1] <= '9') colon--;
    if (colon > 0 && colon < il && id[colon - 1] == ':') il = colon - 1;
    return name_and_json(id, il, s + k + strlen(ARG), n - k - strlen(ARG), name, args);
}
