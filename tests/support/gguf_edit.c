#include "support/gguf_edit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf_write.h"
#include "engine/quant.h"

static const gguf_edit *find_edit(const gguf_edit *e, uint32_t n, gguf_str name, bool tensor)
{
    for (uint32_t i = 0; i < n; i++) {
        bool is_tensor = e[i].kind == GGUF_EDIT_DROP_TENSOR || e[i].kind == GGUF_EDIT_SHAPE ||
                         e[i].kind == GGUF_EDIT_FILL || e[i].kind == GGUF_EDIT_RENAME;
        if (is_tensor == tensor && gguf_str_eq(name, e[i].name))
            return &e[i];
    }
    return NULL;
}

static vki_status set_key(gguf_writer *w, const gguf_edit *e)
{
    switch (e->kind) {
    case GGUF_EDIT_U32: return gguf_w_set_u32(w, e->name, e->u);
    case GGUF_EDIT_F32: return gguf_w_set_f32(w, e->name, e->f);
    case GGUF_EDIT_STR: return gguf_w_set_str(w, e->name, e->s);
    default: return VKI_OK;
    }
}

static vki_status copy_keys(gguf_writer *w, const gguf_file *f, const gguf_edit *e, uint32_t n)
{
    vki_status st = VKI_OK;
    for (uint64_t i = 0; i < gguf_n_kv(f) && st == VKI_OK; i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        const gguf_edit *x = find_edit(e, n, kv->key, false);
        st = x ? set_key(w, x) : gguf_w_copy_kv(w, kv);
    }
    for (uint32_t i = 0; i < n && st == VKI_OK; i++) /* keys the file did not have */
        if (e[i].kind >= GGUF_EDIT_U32 && e[i].kind <= GGUF_EDIT_STR && !gguf_find_kv(f, e[i].name))
            st = set_key(w, &e[i]);
    return st;
}

vki_status gguf_edit_copy(const char *src, const char *dst, const gguf_edit *e, uint32_t n)
{
    gguf_file *f = NULL;
    gguf_writer *w = NULL;
    char err[256];
    vki_status st = gguf_open(src, &f, err, sizeof err);
    if (st != VKI_OK)
        return st;
    st = gguf_w_create(&w);
    if (st == VKI_OK)
        st = copy_keys(w, f, e, n);
    for (uint64_t i = 0; i < gguf_n_tensors(f) && st == VKI_OK; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const gguf_edit *x = find_edit(e, n, t->name, true);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (x && x->kind == GGUF_EDIT_FILL && t->type != VKI_GGML_F32)
            st = VKI_ERR_UNSUPPORTED;
        if (x && x->kind == GGUF_EDIT_RENAME)
            snprintf(name, sizeof name, "%s", x->s);
        if (x && (x->kind == GGUF_EDIT_FILL || x->kind == GGUF_EDIT_RENAME))
            x = NULL; /* same shape, other data or name */
        uint64_t ne[2] = {x ? x->ne0 : t->ne[0], x ? (x->ne1 ? x->ne1 : 1) : t->ne[1]};
        if (st == VKI_OK && (!x || x->kind == GGUF_EDIT_SHAPE))
            st = gguf_w_add_tensor(w, name, t->type, x ? (x->ne1 ? 2 : 1) : t->n_dims, x ? ne : t->ne);
    }
    if (st == VKI_OK)
        st = gguf_w_open(w, dst);
    for (uint64_t i = 0; i < gguf_n_tensors(f) && st == VKI_OK; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const gguf_edit *x = find_edit(e, n, t->name, true);
        if (x && x->kind == GGUF_EDIT_FILL) {
            float *v = malloc(t->nbytes ? t->nbytes : 1);
            for (size_t k = 0; v && k < t->nbytes / 4; k++)
                v[k] = x->f;
            st = v ? gguf_w_data(w, v, t->nbytes) : VKI_ERR_OUT_OF_HOST_MEMORY;
            free(v);
        } else if (!x || x->kind == GGUF_EDIT_RENAME) {
            st = gguf_w_data(w, t->data, t->nbytes);
        } else if (x->kind == GGUF_EDIT_SHAPE) {
            size_t bytes = quant_row_bytes(t->type, x->ne0) * (x->ne1 ? x->ne1 : 1);
            void *zero = calloc(1, bytes ? bytes : 1);
            st = zero ? gguf_w_data(w, zero, bytes) : VKI_ERR_OUT_OF_HOST_MEMORY;
            free(zero);
        }
    }
    if (st == VKI_OK)
        st = gguf_w_finish(w);
    gguf_w_destroy(w);
    gguf_close(f);
    return st;
}

vki_status gguf_edit_split(const char *src, const char *prefix, uint32_t n_files, int32_t declared_total)
{
    gguf_file *f = NULL;
    char err[256], path[1024];
    vki_status st = gguf_open(src, &f, err, sizeof err);
    uint64_t nt = st == VKI_OK ? gguf_n_tensors(f) : 0, per = n_files ? (nt + n_files - 1) / n_files : 0;
    for (uint32_t k = 0; k < n_files && st == VKI_OK; k++) {
        gguf_writer *w = NULL;
        if ((st = gguf_w_create(&w)) != VKI_OK)
            break;
        for (uint64_t i = 0; k == 0 && i < gguf_n_kv(f) && st == VKI_OK; i++)
            st = gguf_w_copy_kv(w, gguf_kv_at(f, i));
        if (st == VKI_OK)
            st = gguf_w_set_u16(w, "split.no", (uint16_t)k);
        if (st == VKI_OK)
            st = gguf_w_set_u16(w, "split.count", (uint16_t)n_files);
        if (st == VKI_OK)
            st = gguf_w_set_i32(w, "split.tensors.count", declared_total >= 0 ? declared_total : (int32_t)nt);
        uint64_t a = k * per, b = a + per < nt ? a + per : nt;
        for (uint64_t i = a; i < b && st == VKI_OK; i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
            st = gguf_w_add_tensor(w, name, t->type, t->n_dims, t->ne);
        }
        snprintf(path, sizeof path, "%s-%05u-of-%05u.gguf", prefix, k + 1, n_files);
        if (st == VKI_OK)
            st = gguf_w_open(w, path);
        for (uint64_t i = a; i < b && st == VKI_OK; i++)
            st = gguf_w_data(w, gguf_tensor_at(f, i)->data, gguf_tensor_at(f, i)->nbytes);
        if (st == VKI_OK)
            st = gguf_w_finish(w);
        gguf_w_destroy(w);
    }
    gguf_close(f);
    return st;
}
