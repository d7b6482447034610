/* Device-layer internals shared by device.c and memory.c. */
#ifndef VKI_ENGINE_MEMORY_INTERNAL_H
#define VKI_ENGINE_MEMORY_INTERNAL_H

#include "engine/device.h"

vki_status vkd_memory_init(vkd_device *d, VkDeviceSize staging_bytes);
void vkd_memory_shutdown(vkd_device *d);

#endif
