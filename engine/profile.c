/* Profile mode: the Chrome trace and the summary table (see profile.h). */
#include "engine/profile.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Step phases: one trace track each. A role belongs to the phase its prefix names. */
static const char *const PHASES[] = {"other", "embed", "attention", "ffn", "lm head", "sample"};
enum { N_PHASES = sizeof PHASES / sizeof PHASES[0] };

static uint32_t phase_of(const char *role)
{
    static const char *const prefix[] = {NULL, "embed", "attn", "ffn", "lm", "sample"};
    for (uint32_t i = 1; role && i < N_PHASES; i++)
        if (!strncmp(role, prefix[i], strlen(prefix[i])))
            return i;
    return 0;
}

vki_status vk_profile_open(vk_profile *p, vkd_cmd *c, const char *path)
{
    memset(p, 0, sizeof *p);
    if (!c->d->info.timestamps) {
        vkd_log(c->d, VKI_LOG_ERROR, "profiling needs timestamp queries, which this device lacks");
        return VKI_ERR_UNSUPPORTED;
    }
    if (!(p->ns = malloc(2 * VK_PROFILE_MAX * sizeof *p->ns)))
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    if (!(p->trace = fopen(path, "w"))) {
        vkd_log(c->d, VKI_LOG_ERROR, "cannot write the profile %s", path);
        free(p->ns);
        p->ns = NULL;
        return VKI_ERR_IO;
    }
    /* track names and order: metadata events, one per phase */
    fputs("[", p->trace);
    for (uint32_t i = 0; i < N_PHASES; i++)
        fprintf(p->trace, "%s\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"args\":{\"name\":\"%s\"}},"
                "\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"args\":{\"sort_index\":%u}}",
                i ? "," : "", i + 1, PHASES[i], i + 1, i ? i : N_PHASES);
    p->n_events = 2 * N_PHASES;
    return vkd_cmd_enable_profiling(c, VK_PROFILE_MAX);
}

/* Adds one dispatch to the summary: O(rows). */
static vki_status add_row(vk_profile *p, uint32_t kind, const char *role, const char *kernel, uint64_t ns)
{
    char key[VK_PROFILE_KEY];
    snprintf(key, sizeof key, "%s%s%s", role ? role : "", role ? " / " : "", kernel);
    for (uint32_t i = 0; i < p->n_rows; i++)
        if (p->rows[i].kind == kind && !strcmp(p->rows[i].key, key)) {
            p->rows[i].calls++;
            p->rows[i].ns += ns;
            return VKI_OK;
        }
    if (p->n_rows == p->cap_rows) {
        uint32_t cap = p->cap_rows ? 2 * p->cap_rows : 32;
        vk_profile_row *r = realloc(p->rows, cap * sizeof *r);
        if (!r)
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        p->rows = r;
        p->cap_rows = cap;
    }
    vk_profile_row *r = &p->rows[p->n_rows++];
    memcpy(r->key, key, sizeof key);
    r->kind = kind;
    r->calls = 1;
    r->ns = ns;
    return VKI_OK;
}

vki_status vk_profile_step(vk_profile *p, vkd_cmd *c, uint64_t step, uint32_t n_tokens, uint32_t n_seqs)
{
    uint64_t *b = p->ns, *en = p->ns + VK_PROFILE_MAX;
    uint32_t n = 0;
    vki_status st = vkd_cmd_read_profile(c, b, en, VK_PROFILE_MAX, &n);
    if (st != VKI_OK || !n)
        return st;
    if (!p->t0_ns)
        p->t0_ns = b[0];
    const uint32_t kind = n_tokens == n_seqs ? VK_PROFILE_DECODE : VK_PROFILE_PROMPT;
    uint64_t first = b[0], last = en[0];
    for (uint32_t i = 0; i < n && st == VKI_OK; i++) {
        /* "step N / layer L / role / kernel": the category is the first part, the name the rest */
        const char *path = c->query_names[i], *rest = strstr(path, " / "), *kernel = strrchr(path, '/');
        rest = rest ? rest + 3 : path;
        kernel = kernel ? kernel + 2 : path;
        const char *role = c->query_roles[i];
        fprintf(p->trace, ",\n{\"name\":\"%s\",\"cat\":\"%.*s\",\"ph\":\"X\",\"pid\":1,\"tid\":%u,\"ts\":%.3f,"
                "\"dur\":%.3f,\"args\":{\"step\":%llu,\"tokens\":%u,\"sequences\":%u}}",
                rest, rest == path ? (int)strlen(path) : (int)(rest - path - 3), path, phase_of(role) + 1,
                (double)(b[i] - p->t0_ns) / 1e3, (double)(en[i] - b[i]) / 1e3, (unsigned long long)step,
                n_tokens, n_seqs);
        first = b[i] < first ? b[i] : first;
        last = en[i] > last ? en[i] : last;
        st = add_row(p, kind, role, kernel, en[i] - b[i]);
    }
    p->n_events += n;
    p->step_ns[kind] += last - first;
    p->n_steps[kind]++;
    return st == VKI_OK && ferror(p->trace) ? VKI_ERR_IO : st;
}

void vk_profile_close(vk_profile *p)
{
    if (p->trace) {
        fputs("\n]\n", p->trace);
        fclose(p->trace);
    }
    free(p->ns);
    free(p->rows);
    memset(p, 0, sizeof *p);
}

static int by_time(const void *a, const void *b)
{
    const vk_profile_row *x = a, *y = b;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : strcmp(x->key, y->key);
}

/* Appends printf output to buf[*len..cap) while it fits; *len counts what did not fit too. */
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*len < cap ? buf + *len : NULL, *len < cap ? cap - *len : 0, fmt, ap);
    va_end(ap);
    *len += n > 0 ? (size_t)n : 0;
}

vki_status vk_profile_summary(const vk_profile *p, uint32_t max_rows, char *buf, size_t cap, size_t *n_out)
{
    *n_out = 0;
    if (!p->trace)
        return VKI_ERR_INVALID_ARG;
    vk_profile_row *rows = malloc((p->n_rows ? p->n_rows : 1) * sizeof *rows);
    if (!rows)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    memcpy(rows, p->rows, p->n_rows * sizeof *rows);
    qsort(rows, p->n_rows, sizeof *rows, by_time);
    size_t len = 0;
    static const char *const kinds[VK_PROFILE_KINDS] = {"decode steps (one token per sequence)",
                                                        "steps with prompt tokens"};
    put(buf, cap, &len, "GPU time by role and kernel: %llu steps, %.3f ms of steps (first dispatch to last)\n",
        (unsigned long long)(p->n_steps[0] + p->n_steps[1]), (p->step_ns[0] + p->step_ns[1]) / 1e6);
    /* the rows are sorted by kind, then by time: one table per kind with steps */
    for (uint32_t k = 0, i = 0; k < VK_PROFILE_KINDS; k++) {
        if (!p->n_steps[k])
            continue;
        put(buf, cap, &len, "%s: %llu, %.3f ms\n", kinds[k], (unsigned long long)p->n_steps[k],
            p->step_ns[k] / 1e6);
        put(buf, cap, &len, "%-40s %8s %12s %10s %7s\n", "role / kernel", "calls", "total ms", "mean us", "% step");
        while (i < p->n_rows && rows[i].kind < k)
            i++;
        for (uint32_t j = 0; i < p->n_rows && rows[i].kind == k; i++, j++)
            if (!max_rows || j < max_rows)
                put(buf, cap, &len, "%-40s %8llu %12.3f %10.2f %6.1f%%\n", rows[i].key,
                    (unsigned long long)rows[i].calls, rows[i].ns / 1e6, rows[i].ns / 1e3 / (double)rows[i].calls,
                    p->step_ns[k] ? 100.0 * (double)rows[i].ns / (double)p->step_ns[k] : 0.0);
    }
    free(rows);
    *n_out = len;
    return len < cap ? VKI_OK : VKI_ERR_INVALID_ARG;
}
