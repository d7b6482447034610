/* Device tensors: a 2-D weight/activation of n_rows rows of ne0 elements in a ggml type, stored
 * as one or more parts of whole rows. A part never exceeds the device's maxStorageBufferRange
 * (128 MiB on lavapipe; a 128k-vocab LM head in F16 is 1 GiB), so every part can be bound as
 * one storage buffer; ops loop over parts (a matmul writes each part's output columns). */
#ifndef VKI_ENGINE_TENSOR_H
#define VKI_ENGINE_TENSOR_H

#include "engine/device.h"

#define VK_TENSOR_MAX_PARTS 64

typedef struct vk_tensor_part {
    vkd_buffer *buf;     /* rows [row0, row0 + n_rows) of the tensor, densely packed */
    uint64_t row0;
    uint64_t n_rows;
} vk_tensor_part;

typedef struct vk_tensor {
    char name[96];
    uint32_t type;       /* VKI_GGML_* */
    uint64_t ne0;        /* elements per row (the contiguous dimension) */
    uint64_t n_rows;     /* product of the other dimensions */
    size_t row_bytes;    /* device row stride: quant_dev_row_bytes(type, ne0) */
    size_t src_row_bytes; /* a GGUF row, as uploads take them: quant_row_bytes(type, ne0) */
    uint32_t n_parts;
    vk_tensor_part parts[VK_TENSOR_MAX_PARTS];
} vk_tensor;

/* Allocates device memory for the tensor. max_part_bytes = 0 uses the device limit
 * (maxStorageBufferRange, and maxMemoryAllocationSize); tests pass a small value to exercise
 * multi-part tensors. Fails with VKI_ERR_UNSUPPORTED for an unknown type or a row longer than a
 * part, VKI_ERR_OUT_OF_DEVICE_MEMORY when memory runs out (nothing is left allocated). */
vki_status vk_tensor_create(vkd_device *d, uint32_t type, uint64_t ne0, uint64_t n_rows,
                            size_t max_part_bytes, const char *name, vk_tensor *out);
/* The same with every part holding whole groups of group_rows rows (a mixture-of-experts
 * tensor: one group per expert), so a kernel binds each expert within one part. n_rows must be
 * a multiple of group_rows; VKI_ERR_UNSUPPORTED when one group exceeds a part. */
vki_status vk_tensor_create_grouped(vkd_device *d, uint32_t type, uint64_t ne0, uint64_t n_rows,
                                    uint64_t group_rows, size_t max_part_bytes, const char *name,
                                    vk_tensor *out);
void vk_tensor_destroy(vkd_device *d, vk_tensor *t);
/* Uploads n_rows * src_row_bytes bytes of row-major data (the GGUF layout) through the staging
 * ring, repacked into the device layout (quant_row_to_dev) where the type has its own. */
vki_status vk_tensor_upload(vkd_device *d, vk_tensor *t, const void *data);
/* Rows [row0, row0 + n_rows) from data (n_rows * src_row_bytes bytes), across the parts they fall
 * in: how concatenated tensors (Q|K|V, gate|up) are filled from their GGUF pieces. */
vki_status vk_tensor_upload_rows(vkd_device *d, vk_tensor *t, uint64_t row0, uint64_t n_rows, const void *data);
/* Device bytes held. */
uint64_t vk_tensor_bytes(const vk_tensor *t);

#endif
