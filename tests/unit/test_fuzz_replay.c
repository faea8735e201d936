/* Replays every saved fuzz input (tests/fuzz/regressions/NAME/, crashes found once, and the seed corpora
 * tests/fuzz/corpus/NAME/) through the same entry points the fuzzers drive, in the normal test build: an
 * input that once crashed must now run to completion. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fuzz/targets.c"

static size_t replay_dir(const sl_fuzz_target *t, const char *kind) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/../fuzz/%s/%s", fixtures(), kind, t->name);
    DIR *d = opendir(dir);
    if (!d) return 0;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "rb");
        cr_assert(f, "cannot open %s", path);
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = malloc((size_t)len + 1);
        cr_assert(len == 0 || fread(buf, 1, (size_t)len, f) == (size_t)len, "cannot read %s", path);
        fclose(f);
        t->run(buf, (size_t)len); /* a crash here fails the test and names the target */
        free(buf);
        n++;
    }
    closedir(d);
    return n;
}

Test(fuzz_replay, every_saved_input, .timeout = 600) {
    cr_assert(getenv("SLUICE_FIXTURES"), "SLUICE_FIXTURES is not set");
    size_t seeds = 0;
    for (const sl_fuzz_target *t = sl_fuzz_targets; t->name; t++) {
        size_t n = replay_dir(t, "corpus");
        cr_expect(n > 0, "no seed inputs for the %s fuzzer", t->name);
        seeds += n;
        replay_dir(t, "regressions");
    }
    cr_log_info("replayed %zu seeds", seeds);
}
