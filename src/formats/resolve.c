#include "formats/resolve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/util.h"
#include "hub/hub.h"

int sl_resolve_model(const char *arg, char **dir, sl_err *e) {
    if (sl_is_dir(arg) || sl_file_exists(arg)) {
        *dir = strdup(arg);
        return *dir ? 0 : sl_fail(e, "out of memory");
    }
    size_t n = strlen(arg);
    if (n > 5 && !strcasecmp(arg + n - 5, ".gguf") && !strchr(arg, ':'))
        return sl_fail(e, "%s: no such GGUF file", arg);
    /* ORG/NAME[@REV][:QUANT or FILE.gguf]: the Hub cache, pulled into when missing */
    size_t rl = strcspn(arg, ":");
    const char *slash = memchr(arg, '/', rl);
    if (!slash || slash == arg || memchr(slash + 1, '/', rl - (size_t)(slash + 1 - arg)) || arg[0] == '.')
        return sl_fail(e,
                       "%s: not a directory (expected a model folder, or a Hub id like Qwen/Qwen3-0.6B in the "
                       "local Hugging Face cache)",
                       arg);
    return sl_hub_resolve(arg, dir, e);
}
