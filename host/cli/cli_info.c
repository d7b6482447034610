/* `vkinfer info [--json]`: devices, features, limits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "host/cli/cli.h"
#include "vkinfer.h"

#define MAX_DEVICES 16

static const char *type_str(vki_device_type t)
{
    static const char *const s[] = {"other", "integrated", "discrete", "virtual", "cpu"};
    return (unsigned)t <= VKI_DEVICE_CPU ? s[t] : "other";
}

static const char *const subgroup_op_names[] = {"basic", "vote", "arithmetic", "ballot",
                                                "shuffle", "shuffle_relative", "clustered", "quad"};

static void api_str(uint32_t v, char *buf, size_t n)
{
    snprintf(buf, n, "%u.%u.%u", (v >> 22) & 0x7f, (v >> 12) & 0x3ff, v & 0xfff);
}

static cJSON *shapes_json(const vki_coopmat_shape *shapes, uint32_t n)
{
    cJSON *cm = cJSON_CreateArray();
    for (uint32_t i = 0; i < n; i++) {
        const vki_coopmat_shape *s = &shapes[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "m", s->m);
        cJSON_AddNumberToObject(e, "n", s->n);
        cJSON_AddNumberToObject(e, "k", s->k);
        cJSON_AddNumberToObject(e, "a_type", s->a_type);
        cJSON_AddNumberToObject(e, "b_type", s->b_type);
        cJSON_AddNumberToObject(e, "c_type", s->c_type);
        cJSON_AddNumberToObject(e, "result_type", s->result_type);
        cJSON_AddBoolToObject(e, "saturating", s->saturating);
        cJSON_AddNumberToObject(e, "scope", s->scope);
        cJSON_AddItemToArray(cm, e);
    }
    return cm;
}

/* The kernels vkinfer runs prefill matmuls and attention with on this device (VKI_COOPMAT_AUTO). */
static void matmul_path(const vki_device_info *d, char *buf, size_t n)
{
    if (d->coopmat_pick.m)
        snprintf(buf, n, "tensor cores (VK_NV_cooperative_matrix %ux%ux%u, F16 operands, F32 accumulation)",
                 d->coopmat_pick.m, d->coopmat_pick.n, d->coopmat_pick.k);
    else
        snprintf(buf, n, "FP32 (no F16 x F16 -> F32 VK_NV_cooperative_matrix shape)");
}

static cJSON *device_json(const vki_device_info *d)
{
    char api[32];
    api_str(d->api_version, api, sizeof api);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", d->index);
    cJSON_AddStringToObject(o, "name", d->name);
    cJSON_AddStringToObject(o, "type", type_str(d->type));
    cJSON_AddNumberToObject(o, "vendor_id", d->vendor_id);
    cJSON_AddNumberToObject(o, "device_id", d->device_id);
    cJSON_AddStringToObject(o, "api_version", api);
    cJSON_AddStringToObject(o, "driver_name", d->driver_name);
    cJSON_AddStringToObject(o, "driver_info", d->driver_info);
    cJSON *f = cJSON_AddObjectToObject(o, "features");
    cJSON_AddBoolToObject(f, "float16", d->float16);
    cJSON_AddBoolToObject(f, "int8", d->int8);
    cJSON_AddBoolToObject(f, "int16", d->int16);
    cJSON_AddBoolToObject(f, "int64", d->int64);
    cJSON_AddBoolToObject(f, "storage_buffer_16bit", d->storage16);
    cJSON_AddBoolToObject(f, "storage_buffer_8bit", d->storage8);
    cJSON_AddBoolToObject(f, "integer_dot_product", d->integer_dot);
    cJSON_AddBoolToObject(f, "integer_dot_4x8_accelerated", d->integer_dot_accel);
    cJSON_AddBoolToObject(f, "memory_model", d->memory_model);
    cJSON_AddBoolToObject(f, "push_descriptor", d->push_descriptor);
    cJSON_AddBoolToObject(f, "debug_utils", d->debug_utils);
    cJSON_AddBoolToObject(f, "timestamps", d->timestamps);
    cJSON_AddNumberToObject(f, "timestamp_period_ns", d->timestamp_period_ns);
    cJSON_AddBoolToObject(f, "cooperative_matrix", d->coopmat);
    cJSON_AddItemToObject(f, "cooperative_matrix_shapes", shapes_json(d->coopmat_shapes, d->n_coopmat));
    cJSON_AddBoolToObject(f, "cooperative_matrix_nv", d->coopmat_nv);
    cJSON_AddItemToObject(f, "cooperative_matrix_nv_shapes", shapes_json(d->coopmat_nv_shapes, d->n_coopmat_nv));
    char path[160];
    matmul_path(d, path, sizeof path);
    cJSON_AddStringToObject(o, "matmul_path", path);
    cJSON *sg = cJSON_AddObjectToObject(o, "subgroup");
    cJSON_AddNumberToObject(sg, "size", d->subgroup_size);
    cJSON_AddNumberToObject(sg, "min_size", d->subgroup_min_size);
    cJSON_AddNumberToObject(sg, "max_size", d->subgroup_max_size);
    cJSON *ops = cJSON_AddArrayToObject(sg, "operations");
    for (int i = 0; i < 8; i++)
        if (d->subgroup_ops & (1u << i))
            cJSON_AddItemToArray(ops, cJSON_CreateString(subgroup_op_names[i]));
    cJSON_AddNumberToObject(o, "compute_units", d->compute_units);
    cJSON *l = cJSON_AddObjectToObject(o, "limits");
    cJSON_AddNumberToObject(l, "max_storage_buffer_range", (double)d->max_storage_buffer_range);
    cJSON_AddNumberToObject(l, "max_memory_allocation_size", (double)d->max_memory_allocation_size);
    cJSON_AddNumberToObject(l, "min_storage_buffer_offset_alignment", (double)d->min_storage_buffer_offset_alignment);
    cJSON_AddNumberToObject(l, "max_push_constants_size", d->max_push_constants_size);
    cJSON_AddNumberToObject(l, "max_compute_shared_memory", d->max_compute_shared_memory);
    cJSON_AddNumberToObject(l, "max_workgroup_invocations", d->max_workgroup_invocations);
    cJSON_AddItemToObject(l, "max_workgroup_size", cJSON_CreateIntArray((const int[]){(int)d->max_workgroup_size[0],
                          (int)d->max_workgroup_size[1], (int)d->max_workgroup_size[2]}, 3));
    cJSON_AddItemToObject(l, "max_workgroup_count", cJSON_CreateDoubleArray((const double[]){d->max_workgroup_count[0],
                          d->max_workgroup_count[1], d->max_workgroup_count[2]}, 3));
    cJSON *heaps = cJSON_AddArrayToObject(o, "memory_heaps");
    for (uint32_t i = 0; i < d->n_heaps; i++) {
        cJSON *h = cJSON_CreateObject();
        cJSON_AddNumberToObject(h, "size", (double)d->heap_size[i]);
        cJSON_AddNumberToObject(h, "budget", (double)d->heap_budget[i]);
        cJSON_AddBoolToObject(h, "device_local", d->heap_device_local[i]);
        cJSON_AddItemToArray(heaps, h);
    }
    return o;
}

/* ": MxNxK(A,B,C,R), ..." with VkComponentTypeKHR numbers (0 = f16, 1 = f32). */
static void print_shapes(const vki_coopmat_shape *s, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        printf("%s%ux%ux%u(A%u,B%u,C%u,R%u)", i ? ", " : ": ", s[i].m, s[i].n, s[i].k, s[i].a_type, s[i].b_type,
               s[i].c_type, s[i].result_type);
}

static void print_text(const vki_device_info *d)
{
    char api[32];
    api_str(d->api_version, api, sizeof api);
    printf("device %u: %s\n", d->index, d->name);
    printf("  type                 %s (vendor 0x%04x, device 0x%04x)\n", type_str(d->type), d->vendor_id, d->device_id);
    printf("  Vulkan               %s, driver %s %s\n", api, d->driver_name, d->driver_info);
    printf("  float16 %s  int8 %s  int16 %s  int64 %s  16-bit storage %s  8-bit storage %s\n",
           d->float16 ? "yes" : "no", d->int8 ? "yes" : "no", d->int16 ? "yes" : "no", d->int64 ? "yes" : "no",
           d->storage16 ? "yes" : "no", d->storage8 ? "yes" : "no");
    const char *idot = d->integer_dot ? (d->integer_dot_accel ? "yes (4x8 accelerated)" : "yes") : "no";
    printf("  integer dot %s  push descriptors %s  debug utils %s  timestamps %s (%.3g ns/tick)\n", idot,
           d->push_descriptor ? "yes" : "no", d->debug_utils ? "yes" : "no", d->timestamps ? "yes" : "no",
           d->timestamp_period_ns);
    if (d->compute_units)
        printf("  compute units        %u\n", d->compute_units);
    printf("  subgroup             size %u", d->subgroup_size);
    if (d->subgroup_min_size)
        printf(" (%u..%u)", d->subgroup_min_size, d->subgroup_max_size);
    printf(", ops:");
    for (int i = 0; i < 8; i++)
        if (d->subgroup_ops & (1u << i))
            printf(" %s", subgroup_op_names[i]);
    printf("\n  cooperative matrix   KHR %s", d->coopmat ? "yes" : "no");
    print_shapes(d->coopmat_shapes, d->n_coopmat);
    printf("\n                       NV %s", d->coopmat_nv ? "yes" : "no");
    print_shapes(d->coopmat_nv_shapes, d->n_coopmat_nv);
    char path[160];
    matmul_path(d, path, sizeof path);
    printf("\n  matmul path          %s", path);
    printf("\n  maxStorageBufferRange %llu MiB, maxMemoryAllocationSize %llu MiB, push constants %u B\n",
           (unsigned long long)(d->max_storage_buffer_range >> 20),
           (unsigned long long)(d->max_memory_allocation_size >> 20), d->max_push_constants_size);
    printf("  workgroup            shared %u KiB, %u invocations, size %u x %u x %u\n",
           d->max_compute_shared_memory >> 10, d->max_workgroup_invocations, d->max_workgroup_size[0],
           d->max_workgroup_size[1], d->max_workgroup_size[2]);
    for (uint32_t i = 0; i < d->n_heaps; i++)
        printf("  heap %u               %llu MiB%s (budget %llu MiB)\n", i,
               (unsigned long long)(d->heap_size[i] >> 20), d->heap_device_local[i] ? " device-local" : "",
               (unsigned long long)(d->heap_budget[i] >> 20));
}

int vki_cli_info(int argc, char **argv)
{
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: vkinfer info [--json]\n");
            return 0;
        } else {
            fprintf(stderr, "vkinfer info: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    vki_device_info *devs = calloc(MAX_DEVICES, sizeof *devs);
    if (!devs)
        return 1;
    uint32_t n = 0;
    vki_status st = vki_list_devices(devs, MAX_DEVICES, &n);
    if (st != VKI_OK) {
        fprintf(stderr, "vkinfer info: %s\n", vki_status_str(st));
        free(devs);
        return 1;
    }
    if (n > MAX_DEVICES)
        n = MAX_DEVICES;
    if (json) {
        cJSON *arr = cJSON_CreateArray();
        for (uint32_t i = 0; i < n; i++)
            cJSON_AddItemToArray(arr, device_json(&devs[i]));
        cJSON *root = cJSON_CreateObject();
        cJSON_AddItemToObject(root, "devices", arr);
        char *s = cJSON_Print(root);
        if (s)
            puts(s);
        free(s);
        cJSON_Delete(root);
    } else {
        for (uint32_t i = 0; i < n; i++)
            print_text(&devs[i]);
    }
    free(devs);
    return 0;
}
