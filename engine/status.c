#include "vkinfer.h"

#define VKI_STR_(x) #x
#define VKI_STR(x) VKI_STR_(x)

const char *vki_version(void)
{
    return VKI_STR(VKI_VERSION_MAJOR) "." VKI_STR(VKI_VERSION_MINOR) "." VKI_STR(VKI_VERSION_PATCH);
}

const char *vki_status_str(vki_status st)
{
    switch (st) {
    case VKI_OK: return "ok";
    case VKI_RETRY_QUEUE_FULL: return "queue full (retry later)";
    case VKI_ERR_INVALID_ARG: return "invalid argument";
    case VKI_ERR_OUT_OF_HOST_MEMORY: return "out of host memory";
    case VKI_ERR_OUT_OF_DEVICE_MEMORY: return "out of device memory";
    case VKI_ERR_DEVICE_LOST: return "device lost";
    case VKI_ERR_NO_DEVICE: return "no Vulkan device";
    case VKI_ERR_VULKAN: return "Vulkan error";
    case VKI_ERR_IO: return "I/O error";
    case VKI_ERR_FORMAT: return "malformed file";
    case VKI_ERR_UNSUPPORTED: return "unsupported";
    case VKI_ERR_DUPLICATE_ID: return "duplicate request id";
    case VKI_ERR_NOT_FOUND: return "not found";
    case VKI_ERR_SHUTDOWN: return "shutting down";
    case VKI_ERR_INTERNAL: return "internal error";
    case VKI_ERR_CANCELLED: return "cancelled";
    }
    return "unknown status";
}
