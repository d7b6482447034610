/* gguf-inspect FILE.gguf [--all]: version, metadata (long arrays abbreviated unless --all) and the
 * tensor table (name, type, shape, offset, bytes), with the types vkinfer cannot run marked. A
 * malformed file (or a tensor type id with no known block size) prints the reader's error and
 * exits 1. */
#include "engine/gguf.h"
#include "engine/quant.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define INSPECT_ARR_SHOWN 8

static void print_str(gguf_str s, size_t max)
{
    putchar('"');
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c); /* UTF-8 bytes pass through */
    }
    if (s.len > max)
        fputs("...", stdout);
    putchar('"');
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t u = 0;
    for (int i = 7; i >= 0; i--)
        u = (u << 8) | p[i];
    return u;
}

/* A string value as stored: u64 length, bytes (already bounds-checked by the reader). */
static gguf_str str_at(const uint8_t *p)
{
    return (gguf_str){(const char *)p + 8, le64(p)};
}

/* One element of a fixed-size type at p. */
static void print_scalar(gguf_type t, const uint8_t *p)
{
    uint32_t u32 = (uint32_t)(p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24);
    uint64_t u64 = le64(p);
    float f;
    double d;
    switch (t) {
    case GGUF_TYPE_UINT8: printf("%u", p[0]); break;
    case GGUF_TYPE_INT8: printf("%d", (int8_t)p[0]); break;
    case GGUF_TYPE_BOOL: fputs(p[0] ? "true" : "false", stdout); break;
    case GGUF_TYPE_UINT16: printf("%u", (unsigned)(p[0] | p[1] << 8)); break;
    case GGUF_TYPE_INT16: printf("%d", (int16_t)(uint16_t)(p[0] | p[1] << 8)); break;
    case GGUF_TYPE_UINT32: printf("%" PRIu32, u32); break;
    case GGUF_TYPE_INT32: printf("%" PRId32, (int32_t)u32); break;
    case GGUF_TYPE_UINT64: printf("%" PRIu64, u64); break;
    case GGUF_TYPE_INT64: printf("%" PRId64, (int64_t)u64); break;
    case GGUF_TYPE_FLOAT32: memcpy(&f, &u32, 4); printf("%g", f); break;
    case GGUF_TYPE_FLOAT64: memcpy(&d, &u64, 8); printf("%g", d); break;
    default: break;
    }
}

/* Works from the kv's value bytes, not by key lookup, so odd keys (embedded NULs) print too. */
static void print_kv(const gguf_kv *kv, bool all)
{
    printf("  ");
    print_str(kv->key, 120);
    printf("%*s %-4s ", kv->key.len < 44 ? (int)(44 - kv->key.len) : 0, "", gguf_type_name(kv->type));
    if (kv->type == GGUF_TYPE_STRING) {
        print_str(str_at(kv->value), all ? SIZE_MAX : 200);
    } else if (kv->type == GGUF_TYPE_ARRAY) {
        printf("[%s x %" PRIu64 "] [", gguf_type_name(kv->arr_type), kv->arr_n);
        uint64_t shown = all ? kv->arr_n : kv->arr_n < INSPECT_ARR_SHOWN ? kv->arr_n : INSPECT_ARR_SHOWN;
        const uint8_t *p = kv->value;
        for (uint64_t i = 0; i < shown; i++) {
            if (i)
                fputs(", ", stdout);
            if (kv->arr_type == GGUF_TYPE_STRING) {
                gguf_str s = str_at(p);
                print_str(s, 64);
                p += 8 + s.len;
            } else {
                uint64_t esz = kv->value_bytes / kv->arr_n;
                print_scalar(kv->arr_type, p);
                p += esz;
            }
        }
        printf("%s]", shown < kv->arr_n ? ", ..." : "");
    } else {
        print_scalar(kv->type, kv->value);
    }
    putchar('\n');
}

/* Every tensor with its type; a type vkinfer cannot run (but whose block size is known, so the
 * file still parses) is marked and listed under the table. */
static void print_tensors(const gguf_file *f)
{
    uint64_t total = 0, n_type[64] = {0};
    printf("\ntensors: %" PRIu64 " (data section at offset %" PRIu64 ")\n", gguf_n_tensors(f), gguf_data_offset(f));
    if (gguf_n_tensors(f) == 0)
        return;
    printf("  %-4s %-32s %-8s %-26s %12s %12s\n", "#", "name", "type", "shape (ne0 first)", "offset", "bytes");
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char shape[96], type[16];
        int k = snprintf(shape, sizeof shape, "[");
        for (uint32_t d = 0; d < t->n_dims && k < (int)sizeof shape; d++)
            k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%" PRIu64, d ? ", " : "", t->ne[d]);
        if (k < (int)sizeof shape)
            snprintf(shape + k, sizeof shape - (size_t)k, "]");
        bool runs = quant_get(t->type) != NULL;
        snprintf(type, sizeof type, "%s%s", quant_type_name(t->type), runs ? "" : "*");
        if (t->type < 64)
            n_type[t->type]++;
        printf("  %-4" PRIu64 " %-32.*s %-8s %-26s %12" PRIu64 " %12" PRIu64 "\n", i, (int)t->name.len, t->name.ptr,
               type, shape, t->offset, t->nbytes);
        total += t->nbytes;
    }
    printf("  total tensor bytes: %" PRIu64 " (%.2f MiB)\n", total, (double)total / (1024.0 * 1024.0));
    printf("  types:");
    for (uint32_t t = 0; t < 64; t++)
        if (n_type[t])
            printf(" %s x%" PRIu64 "%s", quant_type_name(t), n_type[t], quant_get(t) ? "" : "*");
    printf("\n");
    for (uint32_t t = 0; t < 64; t++)
        if (n_type[t] && !quant_get(t)) {
            printf("  * vkinfer cannot run this weight type (it runs %s)\n", quant_supported_list());
            break;
        }
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    bool all = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--all"))
            all = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help") || path)
            path = NULL, argc = 0;
        else
            path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "usage: gguf-inspect FILE.gguf [--all]\n");
        return 2;
    }
    gguf_file *f;
    char err[512] = "";
    vki_status st = gguf_open(path, &f, err, sizeof err);
    if (st != VKI_OK) {
        fprintf(stderr, "gguf-inspect: %s: %s: %s\n", path, vki_status_str(st), err);
        return 1;
    }
    printf("%s: GGUF v%u, %" PRIu64 " bytes, alignment %" PRIu64 "\n", path, gguf_version(f), gguf_file_size(f),
           gguf_alignment(f));
    uint32_t split_no, split_count;
    if (gguf_split_part(f, &split_no, &split_count) == VKI_OK && split_count > 1)
        printf("part %u of a model split in %u files (gguf-split): %s\n", split_no + 1, split_count,
               split_no ? "this part's tensors only; the model opens from the first part"
                        : "the tensors of every part below, each offset within its own part");
    printf("\nmetadata: %" PRIu64 " keys\n", gguf_n_kv(f));
    for (uint64_t i = 0; i < gguf_n_kv(f); i++)
        print_kv(gguf_kv_at(f, i), all);
    print_tensors(f);
    gguf_close(f);
    return 0;
}
