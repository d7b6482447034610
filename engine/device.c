/* Instance, physical-device choice and feature detection, logical device, pipeline cache. */
#include "engine/device.h"
#include "engine/pool.h"

#include <errno.h>
#ifdef __linux__
#include <dlfcn.h>
#include <link.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/kernels.h"
#include "engine/memory_internal.h"
#include "engine/vk_compat.h"

#define VALIDATION_LAYER "VK_LAYER_KHRONOS_validation"

/* ---- logging and results -------------------------------------------------------------------- */

/* The logger when the caller gives none: the library prints nothing by itself. */
static void log_none(void *user, vki_log_level lvl, const char *msg)
{
    (void)user, (void)lvl, (void)msg;
}

void vkd_log(const vkd_device *d, vki_log_level lvl, const char *fmt, ...)
{
    if (lvl > d->log_level)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    d->log(d->log_user, lvl, msg);
}

static const char *vk_result_str(VkResult r)
{
    switch (r) {
#define R(x) case x: return #x;
        R(VK_SUCCESS) R(VK_NOT_READY) R(VK_TIMEOUT) R(VK_INCOMPLETE)
        R(VK_ERROR_OUT_OF_HOST_MEMORY) R(VK_ERROR_OUT_OF_DEVICE_MEMORY)
        R(VK_ERROR_INITIALIZATION_FAILED) R(VK_ERROR_DEVICE_LOST) R(VK_ERROR_MEMORY_MAP_FAILED)
        R(VK_ERROR_LAYER_NOT_PRESENT) R(VK_ERROR_EXTENSION_NOT_PRESENT)
        R(VK_ERROR_FEATURE_NOT_PRESENT) R(VK_ERROR_INCOMPATIBLE_DRIVER)
        R(VK_ERROR_TOO_MANY_OBJECTS) R(VK_ERROR_FORMAT_NOT_SUPPORTED)
        R(VK_ERROR_FRAGMENTED_POOL) R(VK_ERROR_OUT_OF_POOL_MEMORY) R(VK_ERROR_UNKNOWN)
#undef R
    default: return "VkResult(?)";
    }
}

vki_status vkd_check(vkd_device *d, VkResult r, const char *what)
{
    if (r == VK_SUCCESS)
        return VKI_OK;
    vkd_log(d, VKI_LOG_ERROR, "%s failed: %s (%d)", what, vk_result_str(r), (int)r);
    switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: return VKI_ERR_OUT_OF_HOST_MEMORY;
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return VKI_ERR_OUT_OF_DEVICE_MEMORY;
    case VK_ERROR_DEVICE_LOST: d->lost = true; return VKI_ERR_DEVICE_LOST;
    default: return VKI_ERR_VULKAN;
    }
}

void vkd_name(vkd_device *d, VkObjectType type, uint64_t handle, const char *fmt, ...)
{
    if (!d->fn.set_name || !handle)
        return;
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    VkDebugUtilsObjectNameInfoEXT ni = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_OBJECT_NAME_INFO_EXT,
        .objectType = type, .objectHandle = handle, .pObjectName = name};
    d->fn.set_name(d->dev, &ni);
}

static VKAPI_ATTR VkBool32 VKAPI_CALL on_debug_message(
    VkDebugUtilsMessageSeverityFlagBitsEXT sev, VkDebugUtilsMessageTypeFlagsEXT type,
    const VkDebugUtilsMessengerCallbackDataEXT *data, void *user)
{
    vkd_device *d = user;
    vki_log_level lvl = VKI_LOG_DEBUG;
    if (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
        atomic_fetch_add(&d->n_validation_errors, 1);
        lvl = VKI_LOG_ERROR;
    } else if (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        atomic_fetch_add(&d->n_validation_warnings, 1);
        lvl = VKI_LOG_WARN;
    } else if (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_INFO_BIT_EXT) {
        lvl = VKI_LOG_INFO;
    }
    (void)type;
    vkd_log(d, lvl, "validation: %s", data && data->pMessage ? data->pMessage : "(no message)");
    return VK_FALSE;
}

/* ---- instance ------------------------------------------------------------------------------- */

/* 1: the layer is installed; 0: not; -1: out of host memory while listing them. */
static int has_layer(const char *name)
{
    uint32_t n = 0;
    if (vkEnumerateInstanceLayerProperties(&n, NULL) != VK_SUCCESS || !n)
        return 0;
    VkLayerProperties *p = calloc(n, sizeof *p);
    if (!p)
        return -1;
    int found = 0;
    if (p && vkEnumerateInstanceLayerProperties(&n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++)
            found = !strcmp(p[i].layerName, name);
    free(p);
    return found;
}

static bool has_instance_ext(const char *name)
{
    uint32_t n = 0;
    if (vkEnumerateInstanceExtensionProperties(NULL, &n, NULL) != VK_SUCCESS || !n)
        return false;
    VkExtensionProperties *p = calloc(n, sizeof *p);
    bool found = false;
    if (p && vkEnumerateInstanceExtensionProperties(NULL, &n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++)
            found = !strcmp(p[i].extensionName, name);
    free(p);
    return found;
}

static VkDebugUtilsMessengerCreateInfoEXT messenger_info(vkd_device *d)
{
    return (VkDebugUtilsMessengerCreateInfoEXT){
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        .pfnUserCallback = on_debug_message,
        .pUserData = d};
}

/* The Vulkan loader unloads its drivers at vkDestroyInstance and loads them again at the next
 * vkCreateInstance. glibc cannot hand back the static TLS of an unloaded library, and NVIDIA's
 * driver (libnvidia-tls) takes static TLS at each load: on the first NVIDIA run a process that
 * made ~40 devices one after another (engines loaded and unloaded, as the server's model
 * repository does) got "cannot allocate memory in static TLS block" and then "no Vulkan driver
 * found". So every loaded driver (a library exporting vk_icdGetInstanceProcAddr) is marked
 * RTLD_NODELETE once an instance has loaded it: it stays loaded until the process exits. */
#ifdef __linux__
typedef struct {
    char **names; /* NULL: counting */
    char *text;   /* the names' bytes, one block with names */
    size_t n, cap, used, bytes;
} loaded_libs;

static int list_lib(struct dl_phdr_info *info, size_t size, void *user)
{
    (void)size;
    loaded_libs *l = user;
    if (!info->dlpi_name || !info->dlpi_name[0])
        return 0;
    size_t len = strlen(info->dlpi_name) + 1;
    if (!l->names) {
        l->cap++;
        l->bytes += len;
    } else if (l->n < l->cap && len <= l->bytes - l->used) {
        l->names[l->n++] = memcpy(l->text + l->used, info->dlpi_name, len);
        l->used += len;
    }
    return 0;
}

static void pin_drivers(void)
{
    /* the names first, then dlopen: the callback runs under the loader's lock. One allocation
     * for all of them (a process has ~50 libraries loaded: a copy each was 50 allocations per
     * instance, each a full engine load in test_faults' walk over failing allocations) */
    loaded_libs l = {0};
    dl_iterate_phdr(list_lib, &l);
    l.cap += 8; /* a thread may load more in between */
    l.bytes += 8 * 256;
    if (!(l.names = malloc(l.cap * sizeof *l.names + l.bytes)))
        return; /* only a later reload can fail then, as before */
    l.text = (char *)(l.names + l.cap);
    dl_iterate_phdr(list_lib, &l);
    for (size_t i = 0; i < l.n; i++) {
        void *h = dlopen(l.names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h && dlsym(h, "vk_icdGetInstanceProcAddr")) {
            void *pin = dlopen(l.names[i], RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
            if (pin)
                dlclose(pin);
        }
        if (h)
            dlclose(h);
    }
    free(l.names);
}
#else
static void pin_drivers(void) {}
#endif

/* Creates d->instance; with validation, also the layer and a messenger that counts messages. */
static vki_status create_instance(vkd_device *d, bool validation, bool *debug_utils)
{
    uint32_t api = VK_API_VERSION_1_2;
    if (vkEnumerateInstanceVersion(&api) != VK_SUCCESS)
        api = VK_API_VERSION_1_2;
    if (api > VK_API_VERSION_1_3)
        api = VK_API_VERSION_1_3;
    int layer = validation ? has_layer(VALIDATION_LAYER) : 1;
    if (layer < 0) {
        vkd_log(d, VKI_LOG_ERROR, "out of host memory listing the Vulkan layers");
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    if (!layer) {
        vkd_log(d, VKI_LOG_ERROR, "validation requested but %s is not installed "
                "(Debian: apt-get install vulkan-validationlayers)", VALIDATION_LAYER);
        return VKI_ERR_UNSUPPORTED;
    }
    *debug_utils = has_instance_ext(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    const char *exts[1] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
    const char *layers[1] = {VALIDATION_LAYER};
    VkDebugUtilsMessengerCreateInfoEXT mi = messenger_info(d);
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                             .pApplicationName = "vkinfer", .pEngineName = "vkinfer",
                             .apiVersion = api};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                               .pNext = (validation && *debug_utils) ? &mi : NULL,
                               .pApplicationInfo = &app,
                               .enabledLayerCount = validation ? 1 : 0, .ppEnabledLayerNames = layers,
                               .enabledExtensionCount = *debug_utils ? 1 : 0,
                               .ppEnabledExtensionNames = exts};
    VkResult r = vkCreateInstance(&ci, NULL, &d->instance);
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER) {
        vkd_log(d, VKI_LOG_ERROR, "no Vulkan driver found (Debian: apt-get install mesa-vulkan-drivers "
                "for the CPU device, or install your GPU's driver)");
        return VKI_ERR_NO_DEVICE;
    }
    VKD_TRY(d, r);
    pin_drivers();
    if (validation && *debug_utils) {
        PFN_vkCreateDebugUtilsMessengerEXT create = (PFN_vkCreateDebugUtilsMessengerEXT)
            vkGetInstanceProcAddr(d->instance, "vkCreateDebugUtilsMessengerEXT");
        if (create)
            VKD_TRY(d, create(d->instance, &mi, NULL, &d->messenger));
    }
    return VKI_OK;
}

/* ---- physical devices ----------------------------------------------------------------------- */

static bool has_device_ext(const VkExtensionProperties *e, uint32_t n, const char *name)
{
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(e[i].extensionName, name))
            return true;
    return false;
}

/* The shapes of VK_KHR_cooperative_matrix (khr) or VK_NV_cooperative_matrix into out[], how many:
 * one query with two structs (NV has no saturating flag; its component and scope enums have the
 * KHR values). */
static uint32_t query_coopmat(VkInstance inst, VkPhysicalDevice pd, bool khr, vki_coopmat_shape *out)
{
    PFN_vkVoidFunction fn = vkGetInstanceProcAddr(inst, khr ? "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"
                                                            : "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
    PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR get_khr =
        (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)fn;
    PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV get_nv =
        (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)fn;
    union {
        VkCooperativeMatrixPropertiesKHR k[VKI_MAX_COOPMAT];
        VkCooperativeMatrixPropertiesNV n[VKI_MAX_COOPMAT];
    } p;
    uint32_t n = 0;
    if (!fn || (khr ? get_khr(pd, &n, NULL) : get_nv(pd, &n, NULL)) != VK_SUCCESS)
        return 0;
    n = n < VKI_MAX_COOPMAT ? n : VKI_MAX_COOPMAT;
    for (uint32_t i = 0; i < n; i++) {
        if (khr)
            p.k[i] = (VkCooperativeMatrixPropertiesKHR){.sType = VKI_STYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR};
        else
            p.n[i] = (VkCooperativeMatrixPropertiesNV){.sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV};
    }
    VkResult r = khr ? get_khr(pd, &n, p.k) : get_nv(pd, &n, p.n);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE)
        return 0;
    for (uint32_t i = 0; i < n; i++) {
        const VkCooperativeMatrixPropertiesKHR *k = &p.k[i];
        const VkCooperativeMatrixPropertiesNV *v = &p.n[i];
        out[i] = khr ? (vki_coopmat_shape){k->MSize, k->NSize, k->KSize, k->AType, k->BType, k->CType, k->ResultType,
                                           k->saturatingAccumulation, k->scope}
                     : (vki_coopmat_shape){v->MSize, v->NSize, v->KSize, v->AType, v->BType, v->CType, v->DType,
                                           false, v->scope};
    }
    return n;
}

/* The NV shape the kernels use: F16 A/B, F32 C/result, subgroup scope, sides 8..32 in multiples of
 * 8 (the tile arithmetic assumes them); 16x16x16 when offered (one fragment covers the 16-wide
 * shared-memory rows), else the one with the most work per multiply-add. */
static vki_coopmat_shape pick_coopmat(const vki_device_info *info)
{
    vki_coopmat_shape best = {0};
    for (uint32_t i = 0; i < info->n_coopmat_nv; i++) {
        const vki_coopmat_shape *s = &info->coopmat_nv_shapes[i];
        bool side_ok = s->m % 8 == 0 && s->n % 8 == 0 && s->k % 8 == 0 && s->m && s->n && s->k && s->m <= 32 &&
                       s->n <= 32 && s->k <= 32;
        if (s->a_type != 0 || s->b_type != 0 || s->c_type != 1 || s->result_type != 1 || s->scope != 3 || !side_ok)
            continue;
        bool square16 = s->m == 16 && s->n == 16 && s->k == 16;
        if (!best.m || square16 || (!(best.m == 16 && best.n == 16 && best.k == 16) &&
                                    s->m * s->n * s->k > best.m * best.n * best.k))
            best = *s;
    }
    return best;
}

/* Features (and the cooperative-matrix shapes, which need them) of one physical device. */
static void query_features(VkInstance inst, VkPhysicalDevice pd, uint32_t api, bool dot_ext, vki_device_info *info)
{
    VkPhysicalDeviceCooperativeMatrixFeaturesNV nvf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
    VkPhysicalDeviceCooperativeMatrixFeaturesKHR cmf = {
        .sType = VKI_STYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR, .pNext = info->coopmat_nv ? &nvf : NULL};
    void *cm_chain = info->coopmat ? (void *)&cmf : info->coopmat_nv ? (void *)&nvf : NULL;
    VkPhysicalDeviceVulkan13Features f13 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES,
                                            .pNext = cm_chain};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                            .pNext = api >= VK_API_VERSION_1_3 ? (void *)&f13 : cm_chain};
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &f12};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f11};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    info->float16 = f12.shaderFloat16;
    info->int8 = f12.shaderInt8;
    info->int16 = f2.features.shaderInt16;
    info->int64 = f2.features.shaderInt64;
    info->storage16 = f11.storageBuffer16BitAccess;
    info->storage8 = f12.storageBuffer8BitAccess;
    info->integer_dot = (api >= VK_API_VERSION_1_3 && f13.shaderIntegerDotProduct) || dot_ext;
    info->memory_model = f12.vulkanMemoryModel && f12.vulkanMemoryModelDeviceScope;
    info->coopmat = info->coopmat && cmf.cooperativeMatrix;
    if (info->coopmat)
        info->n_coopmat = query_coopmat(inst, pd, true, info->coopmat_shapes);
    info->coopmat_nv = info->coopmat_nv && nvf.cooperativeMatrix;
    if (info->coopmat_nv) {
        VkPhysicalDeviceCooperativeMatrixPropertiesNV np = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_NV};
        VkPhysicalDeviceProperties2 pp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &np};
        vkGetPhysicalDeviceProperties2(pd, &pp);
        info->n_coopmat_nv = query_coopmat(inst, pd, false, info->coopmat_nv_shapes);
        /* fcoopmatNV<16, ...> needs Float16; glslang's NV modules use the Vulkan memory model;
         * the kernels stage F16 operands through 16-bit storage and name warps by gl_SubgroupID */
        if ((np.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT) && f12.shaderFloat16 &&
            info->memory_model && f11.storageBuffer16BitAccess && (info->subgroup_ops & VKI_SUBGROUP_BASIC))
            info->coopmat_pick = pick_coopmat(info);
    }
}

void vkd_read_heaps(PFN_vkGetPhysicalDeviceMemoryProperties2 get, VkPhysicalDevice pd, vki_device_info *info)
{
    VkPhysicalDeviceMemoryBudgetPropertiesEXT mb = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
    VkPhysicalDeviceMemoryProperties2 mp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
                                            .pNext = info->memory_budget ? &mb : NULL};
    get(pd, &mp);
    info->n_heaps = mp.memoryProperties.memoryHeapCount < VKI_MAX_HEAPS ? mp.memoryProperties.memoryHeapCount
                                                                        : VKI_MAX_HEAPS;
    for (uint32_t i = 0; i < info->n_heaps; i++) {
        info->heap_size[i] = mp.memoryProperties.memoryHeaps[i].size;
        info->heap_device_local[i] = mp.memoryProperties.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT;
        info->heap_budget[i] = info->memory_budget && mb.heapBudget[i] ? mb.heapBudget[i] : info->heap_size[i];
        info->heap_usage[i] = info->memory_budget ? mb.heapUsage[i] : 0;
    }
}

/* Fills *info for one physical device. Returns false if it cannot run vkinfer at all
 * (Vulkan < 1.2 or no compute queue); such devices are still listed. */
/* false: not usable, or *oom (out of host memory: nothing can be said about it). */
static bool describe_device(VkInstance inst, VkPhysicalDevice pd, uint32_t index, vki_device_info *info, bool *oom)
{
    *oom = false;
    memset(info, 0, sizeof *info);
    info->index = index;
    VkPhysicalDeviceProperties bp;
    vkGetPhysicalDeviceProperties(pd, &bp);
    snprintf(info->name, sizeof info->name, "%s", bp.deviceName);
    info->api_version = bp.apiVersion;
    info->driver_version = bp.driverVersion;
    info->vendor_id = bp.vendorID;
    info->device_id = bp.deviceID;
    switch (bp.deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: info->type = VKI_DEVICE_INTEGRATED; break;
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: info->type = VKI_DEVICE_DISCRETE; break;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: info->type = VKI_DEVICE_VIRTUAL; break;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: info->type = VKI_DEVICE_CPU; break;
    default: info->type = VKI_DEVICE_OTHER; break;
    }
    const VkPhysicalDeviceLimits *l = &bp.limits;
    info->max_storage_buffer_range = l->maxStorageBufferRange;
    info->min_storage_buffer_offset_alignment = l->minStorageBufferOffsetAlignment;
    info->max_push_constants_size = l->maxPushConstantsSize;
    info->max_compute_shared_memory = l->maxComputeSharedMemorySize;
    info->max_workgroup_invocations = l->maxComputeWorkGroupInvocations;
    for (int i = 0; i < 3; i++) {
        info->max_workgroup_size[i] = l->maxComputeWorkGroupSize[i];
        info->max_workgroup_count[i] = l->maxComputeWorkGroupCount[i];
    }
    if (bp.apiVersion < VK_API_VERSION_1_2)
        return false;

    uint32_t n_ext = 0;
    vkEnumerateDeviceExtensionProperties(pd, NULL, &n_ext, NULL);
    VkExtensionProperties *ext = calloc(n_ext ? n_ext : 1, sizeof *ext);
    if (!ext) {
        *oom = true;
        return false;
    }
    vkEnumerateDeviceExtensionProperties(pd, NULL, &n_ext, ext);
    info->push_descriptor = has_device_ext(ext, n_ext, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
    info->coopmat = has_device_ext(ext, n_ext, VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME);
    info->coopmat_nv = has_device_ext(ext, n_ext, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
    bool budget = has_device_ext(ext, n_ext, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
    bool dot_ext = has_device_ext(ext, n_ext, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
    bool sm_ext = has_device_ext(ext, n_ext, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME);
    bool amd_cores = has_device_ext(ext, n_ext, VK_AMD_SHADER_CORE_PROPERTIES_EXTENSION_NAME);
    free(ext);

    /* properties */
    /* the number of SMs / CUs, where the driver tells (properties of a supported extension may
     * be queried without enabling it) */
    VkPhysicalDeviceShaderSMBuiltinsPropertiesNV smb = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
    VkPhysicalDeviceShaderCorePropertiesAMD amd = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD,
                                                   .pNext = sm_ext ? &smb : NULL};
    VkPhysicalDeviceShaderIntegerDotProductProperties idot = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES,
        .pNext = amd_cores ? (void *)&amd : sm_ext ? (void *)&smb : NULL};
    VkPhysicalDeviceSubgroupSizeControlProperties ssc = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES, .pNext = &idot};
    VkPhysicalDeviceDriverProperties drv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES,
                                            .pNext = bp.apiVersion >= VK_API_VERSION_1_3 ? &ssc : NULL};
    VkPhysicalDeviceIDProperties idp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES, .pNext = &drv};
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
                                             .pNext = &idp};
    VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES,
                                                 .pNext = &sg};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &m3};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    info->max_memory_allocation_size = m3.maxMemoryAllocationSize;
    if (sm_ext)
        info->compute_units = smb.shaderSMCount;
    else if (amd_cores)
        info->compute_units = amd.shaderEngineCount * amd.shaderArraysPerEngineCount * amd.computeUnitsPerShaderArray;
    info->subgroup_size = sg.subgroupSize;
    if (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT)
        info->subgroup_ops = sg.supportedOperations; /* same bit positions as VKI_SUBGROUP_* */
    memcpy(info->uuid, idp.deviceUUID, 16);
    snprintf(info->driver_name, sizeof info->driver_name, "%s", drv.driverName);
    snprintf(info->driver_info, sizeof info->driver_info, "%s", drv.driverInfo);
    if (bp.apiVersion >= VK_API_VERSION_1_3) {
        info->subgroup_min_size = ssc.minSubgroupSize;
        info->subgroup_max_size = ssc.maxSubgroupSize;
    }

    query_features(inst, pd, bp.apiVersion, dot_ext, info);
    info->integer_dot_accel = info->integer_dot && bp.apiVersion >= VK_API_VERSION_1_3 &&
                              idot.integerDotProduct4x8BitPackedSignedAccelerated;

    /* memory */
    info->memory_budget = budget;
    vkd_read_heaps(vkGetPhysicalDeviceMemoryProperties2, pd, info);

    /* queue: need compute; timestamps */
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, NULL);
    VkQueueFamilyProperties q[16];
    if (nq > 16)
        nq = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, q);
    bool compute = false;
    for (uint32_t i = 0; i < nq; i++) {
        if (q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            compute = true;
            info->timestamps = q[i].timestampValidBits > 0 && l->timestampPeriod > 0;
            break;
        }
    }
    info->timestamp_period_ns = l->timestampPeriod;
    return compute;
}

/* Preference: discrete NVIDIA > discrete > integrated > virtual > CPU > other. */
static int device_rank(const vki_device_info *i)
{
    switch (i->type) {
    case VKI_DEVICE_DISCRETE: return i->vendor_id == 0x10DE ? 6 : 5;
    case VKI_DEVICE_INTEGRATED: return 4;
    case VKI_DEVICE_VIRTUAL: return 3;
    case VKI_DEVICE_CPU: return 2;
    default: return 1;
    }
}

static vki_status enumerate(vkd_device *d, VkPhysicalDevice **pds, uint32_t *n)
{
    *n = 0;
    VKD_TRY(d, vkEnumeratePhysicalDevices(d->instance, n, NULL));
    if (!*n)
        return VKI_ERR_NO_DEVICE;
    *pds = calloc(*n, sizeof **pds);
    if (!*pds)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    VkResult r = vkEnumeratePhysicalDevices(d->instance, n, *pds);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        free(*pds);
        *pds = NULL;
        return vkd_check(d, r, "vkEnumeratePhysicalDevices");
    }
    return VKI_OK;
}

static vki_status pick_device(vkd_device *d, const vki_device_params *p)
{
    VkPhysicalDevice *pds = NULL;
    uint32_t n = 0;
    vki_status st = enumerate(d, &pds, &n);
    if (st != VKI_OK) {
        if (st == VKI_ERR_NO_DEVICE)
            vkd_log(d, VKI_LOG_ERROR, "no Vulkan device found");
        return st;
    }
    int best = -1, best_rank = -1;
    vki_device_info info;
    for (uint32_t i = 0; i < n; i++) {
        bool oom, usable = describe_device(d->instance, pds[i], i, &info, &oom) && info.push_descriptor;
        if (oom) {
            free(pds);
            vkd_log(d, VKI_LOG_ERROR, "out of host memory describing Vulkan device %u", i);
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        }
        bool wanted = true;
        if (p->device_index >= 0)
            wanted = (int)i == p->device_index;
        else if (p->device_name && *p->device_name)
            wanted = strcasestr(info.name, p->device_name) != NULL;
        if (wanted && !usable)
            vkd_log(d, VKI_LOG_WARN, "device %u (%s) skipped: needs Vulkan 1.2, a compute queue and "
                    "VK_KHR_push_descriptor", i, info.name);
        if (wanted && usable && device_rank(&info) > best_rank) {
            best = (int)i;
            best_rank = device_rank(&info);
        }
    }
    if (best < 0) {
        free(pds);
        vkd_log(d, VKI_LOG_ERROR, "no usable Vulkan device matches (index %d, name \"%s\")",
                p->device_index, p->device_name ? p->device_name : "");
        return VKI_ERR_NO_DEVICE;
    }
    d->phys = pds[best];
    free(pds);
    bool oom;
    describe_device(d->instance, d->phys, (uint32_t)best, &d->info, &oom);
    if (oom) { /* a half-filled description would disable what the device has */
        vkd_log(d, VKI_LOG_ERROR, "out of host memory describing Vulkan device %d", best);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    return VKI_OK;
}

/* ---- logical device ------------------------------------------------------------------------- */

static bool phys_has_ext(VkPhysicalDevice pd, const char *name)
{
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || !n)
        return false;
    VkExtensionProperties *e = calloc(n, sizeof *e);
    bool found = e && vkEnumerateDeviceExtensionProperties(pd, NULL, &n, e) == VK_SUCCESS && has_device_ext(e, n, name);
    free(e);
    return found;
}

static vki_status create_logical_device(vkd_device *d, vki_coopmat_mode cm_mode)
{
    const vki_device_info *in = &d->info;
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &nq, NULL);
    VkQueueFamilyProperties q[16];
    if (nq > 16)
        nq = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &nq, q);
    /* Prefer a compute-only family (async compute on discrete GPUs), else any with compute. */
    int fam = -1;
    for (uint32_t i = 0; i < nq && fam < 0; i++)
        if ((q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && !(q[i].queueFlags & VK_QUEUE_GRAPHICS_BIT))
            fam = (int)i;
    for (uint32_t i = 0; i < nq && fam < 0; i++)
        if (q[i].queueFlags & VK_QUEUE_COMPUTE_BIT)
            fam = (int)i;
    if (fam < 0)
        return VKI_ERR_NO_DEVICE;
    d->queue_family = (uint32_t)fam;
    d->info.timestamps = q[fam].timestampValidBits > 0 && in->timestamp_period_ns > 0;

    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                   .queueFamilyIndex = d->queue_family, .queueCount = 1,
                                   .pQueuePriorities = &prio};
    const char *exts[5];
    uint32_t n_ext = 0;
    exts[n_ext++] = VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME;
    /* the profiling build's SPIR-V (VKI_SHADER_DEBUG) imports NonSemantic.Shader.DebugInfo.100:
     * core in Vulkan 1.3, an extension before; enabling it costs nothing */
    if (in->api_version < VK_API_VERSION_1_3 && phys_has_ext(d->phys, VK_KHR_SHADER_NON_SEMANTIC_INFO_EXTENSION_NAME))
        exts[n_ext++] = VK_KHR_SHADER_NON_SEMANTIC_INFO_EXTENSION_NAME;
    if (in->memory_budget)
        exts[n_ext++] = VK_EXT_MEMORY_BUDGET_EXTENSION_NAME;
    /* The NV tensor-core modules: the extension, its feature and the memory model they declare.
     * The memory model is enabled wherever the device has it, with device scope: enabled, it
     * binds every module of the device (the other kernels' device-scope barriers and atomics
     * need vulkanMemoryModelDeviceScope: VUID-RuntimeSpirv-vulkanMemoryModel-06265, 2,546
     * validation errors on the first NVIDIA run, where only the NV path enabled it), and
     * lavapipe's validated suites then run the kernels under the rules NVIDIA's run does.
     * VK_KHR_cooperative_matrix is queried for `info` but not enabled: no module uses it
     * (glslang 12 cannot write it), and validation layers older than the extension reject its
     * feature struct in vkCreateDevice. */
    bool nv = in->coopmat_pick.m && cm_mode != VKI_COOPMAT_OFF;
    if (nv)
        exts[n_ext++] = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
    bool v13 = in->api_version >= VK_API_VERSION_1_3;
    VkPhysicalDeviceVulkan13Features f13 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES,
                                            .shaderIntegerDotProduct = in->integer_dot && v13};
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
        .pNext = v13 ? (void *)&f13 : NULL,
        .shaderFloat16 = in->float16, .shaderInt8 = in->int8, .storageBuffer8BitAccess = in->storage8,
        .vulkanMemoryModel = in->memory_model, .vulkanMemoryModelDeviceScope = in->memory_model};
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &f12, .storageBuffer16BitAccess = in->storage16};
    VkPhysicalDeviceCooperativeMatrixFeaturesNV nvf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV, .pNext = &f11,
        .cooperativeMatrix = VK_TRUE};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                    .pNext = nv ? (void *)&nvf : (void *)&f11,
                                    .features = {.shaderInt16 = in->int16, .shaderInt64 = in->int64}};
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = &f2,
                              .queueCreateInfoCount = 1, .pQueueCreateInfos = &qci,
                              .enabledExtensionCount = n_ext, .ppEnabledExtensionNames = exts};
    VKD_TRY(d, vkCreateDevice(d->phys, &dci, NULL, &d->dev));
    vkGetDeviceQueue(d->dev, d->queue_family, 0, &d->queue);
    d->nv_coopmat = nv;

    d->fn.push_descriptor = (PFN_vkCmdPushDescriptorSetKHR)vkGetDeviceProcAddr(d->dev, "vkCmdPushDescriptorSetKHR");
    if (d->info.debug_utils) {
        d->fn.set_name = (PFN_vkSetDebugUtilsObjectNameEXT)vkGetInstanceProcAddr(d->instance, "vkSetDebugUtilsObjectNameEXT");
        d->fn.label_begin = (PFN_vkCmdBeginDebugUtilsLabelEXT)vkGetInstanceProcAddr(d->instance, "vkCmdBeginDebugUtilsLabelEXT");
        d->fn.label_end = (PFN_vkCmdEndDebugUtilsLabelEXT)vkGetInstanceProcAddr(d->instance, "vkCmdEndDebugUtilsLabelEXT");
    }
    if (!d->fn.push_descriptor)
        return VKI_ERR_UNSUPPORTED;
    vkd_name(d, VK_OBJECT_TYPE_QUEUE, (uint64_t)(uintptr_t)d->queue, "vkinfer compute queue");

    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = d->queue_family};
    VKD_TRY(d, vkCreateCommandPool(d->dev, &pci, NULL, &d->cmd_pool));
    return VKI_OK;
}

/* ---- cooperative-matrix path ---------------------------------------------------------------- */

vki_status vkd_coopmat_select(vkd_device *d, vki_coopmat_mode mode)
{
    const vki_device_info *in = &d->info;
    if (mode == VKI_COOPMAT_EMULATED) {
        uint32_t sg = in->subgroup_size, need = VKI_SUBGROUP_BASIC | VKI_SUBGROUP_SHUFFLE;
        /* fragments of 16 x max(16, sg): the emulation needs n % sg == 0 (coopmat.glsl) */
        if (!in->float16 || !in->storage16 || (in->subgroup_ops & need) != need || !sg || sg > 64 ||
            (sg & (sg - 1))) {
            vkd_log(d, VKI_LOG_ERROR, "emulated cooperative matrices need shaderFloat16, 16-bit storage, "
                    "subgroup shuffles and a power-of-two subgroup size up to 64");
            return VKI_ERR_UNSUPPORTED;
        }
        d->cm = (vkd_cm){VKD_CM_EMULATED, 16, sg > 16 ? sg : 16, 16, sg};
    } else if (mode == VKI_COOPMAT_AUTO && d->nv_coopmat) {
        d->cm = (vkd_cm){VKD_CM_NV, in->coopmat_pick.m, in->coopmat_pick.n, in->coopmat_pick.k, in->subgroup_size};
    } else if (mode == VKI_COOPMAT_AUTO || mode == VKI_COOPMAT_OFF) {
        d->cm = (vkd_cm){VKD_CM_NONE, 0, 0, 0, 0};
    } else {
        return VKI_ERR_INVALID_ARG;
    }
    return VKI_OK;
}

/* ---- pipeline cache on disk ----------------------------------------------------------------- */

/* true if the whole string fit */
static bool fmt(char *buf, size_t n, const char *f, const char *a, const char *b)
{
    int r = snprintf(buf, n, f, a, b);
    return r >= 0 && (size_t)r < n;
}

static void cache_path(vkd_device *d, const char *dir)
{
    d->pipeline_cache_path[0] = 0;
    char base[400], parent[400];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (dir && !*dir)
        return; /* disabled */
    bool ok;
    if (dir) {
        ok = fmt(base, sizeof base, "%s%s", dir, "");
    } else if (xdg && *xdg) {
        ok = fmt(base, sizeof base, "%s/%s", xdg, "vkinfer");
    } else if (home && *home) {
        ok = fmt(parent, sizeof parent, "%s/%s", home, ".cache") &&
             fmt(base, sizeof base, "%s/%s", parent, "vkinfer");
        if (ok)
            mkdir(parent, 0755);
    } else {
        return;
    }
    if (!ok || (mkdir(base, 0755) != 0 && errno != EEXIST))
        return;
    char name[64];
    int o = snprintf(name, sizeof name, "pipelines-");
    for (int i = 0; i < 16; i++)
        o += snprintf(name + o, sizeof name - (size_t)o, "%02x", d->info.uuid[i]);
    snprintf(name + o, sizeof name - (size_t)o, "-%08x.bin", d->info.driver_version);
    if (!fmt(d->pipeline_cache_path, sizeof d->pipeline_cache_path, "%s/%s", base, name))
        d->pipeline_cache_path[0] = 0;
}

static vki_status create_pipeline_cache(vkd_device *d)
{
    void *data = NULL;
    size_t size = 0;
    FILE *f = d->pipeline_cache_path[0] ? fopen(d->pipeline_cache_path, "rb") : NULL;
    if (f) {
        if (fseek(f, 0, SEEK_END) == 0) {
            long n = ftell(f);
            if (n > 32 && n < (1l << 30) && fseek(f, 0, SEEK_SET) == 0 && (data = malloc((size_t)n))) {
                size = fread(data, 1, (size_t)n, f) == (size_t)n ? (size_t)n : 0;
            }
        }
        fclose(f);
    }
    /* The driver checks the header (vendor, device, cache UUID) and ignores a stale cache. */
    VkPipelineCacheCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
                                    .initialDataSize = size, .pInitialData = size ? data : NULL};
    VkResult r = vkCreatePipelineCache(d->dev, &ci, NULL, &d->pipeline_cache);
    if (r != VK_SUCCESS && size) {
        ci.initialDataSize = 0;
        ci.pInitialData = NULL;
        r = vkCreatePipelineCache(d->dev, &ci, NULL, &d->pipeline_cache);
    }
    free(data);
    return vkd_check(d, r, "vkCreatePipelineCache");
}

static void save_pipeline_cache(vkd_device *d)
{
    if (!d->pipeline_cache || !d->pipeline_cache_path[0])
        return;
    size_t n = 0;
    if (vkGetPipelineCacheData(d->dev, d->pipeline_cache, &n, NULL) != VK_SUCCESS || !n)
        return;
    void *data = malloc(n);
    if (!data)
        return;
    if (vkGetPipelineCacheData(d->dev, d->pipeline_cache, &n, data) == VK_SUCCESS) {
        char tmp[sizeof d->pipeline_cache_path + 32];
        snprintf(tmp, sizeof tmp, "%s.%d.tmp", d->pipeline_cache_path, (int)getpid());
        FILE *f = fopen(tmp, "wb");
        if (f) {
            bool ok = fwrite(data, 1, n, f) == n;
            ok = (fclose(f) == 0) && ok;
            if (!ok || rename(tmp, d->pipeline_cache_path) != 0)
                remove(tmp);
        }
    }
    free(data);
}

/* ---- open / close --------------------------------------------------------------------------- */

vki_device_params vki_device_default_params(void)
{
    return (vki_device_params){.device_index = -1, .log_level = VKI_LOG_WARN};
}

vki_status vkd_open(const vki_device_params *p, vkd_device **out)
{
    *out = NULL;
    vki_device_params defaults = vki_device_default_params();
    if (!p)
        p = &defaults;
    vkd_device *d = calloc(1, sizeof *d);
    if (!d)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    d->log = p->log ? p->log : log_none;
    d->fn.memory_properties2 = vkGetPhysicalDeviceMemoryProperties2;
    d->log_user = p->log_user;
    d->log_level = p->log_level;
    atomic_init(&d->n_validation_errors, 0);
    atomic_init(&d->n_validation_warnings, 0);

    bool debug_utils = false;
    vki_status st = create_instance(d, p->validation, &debug_utils);
    if (st == VKI_OK)
        st = pick_device(d, p);
    if (st == VKI_OK) {
        d->info.debug_utils = debug_utils;
        st = create_logical_device(d, p->coopmat);
    }
    if (st == VKI_OK) {
        d->gemv_max_m = p->gemv_max_m;
        d->load_threads = p->load_threads ? p->load_threads : vk_cores(VK_POOL_MAX_THREADS);
        st = vkd_coopmat_select(d, p->coopmat);
    }
    if (st == VKI_OK)
        st = vkd_memory_init(d, VKD_STAGING_BYTES);
    if (st == VKI_OK) {
        cache_path(d, p->pipeline_cache_dir);
        st = create_pipeline_cache(d);
    }
    if (st == VKI_OK)
        st = vkd_kernels_create(d);
    if (st != VKI_OK) {
        vkd_close(d);
        return st;
    }
    vkd_log(d, VKI_LOG_INFO, "device %u: %s (%s %s); matmul path: %s %ux%ux%u", d->info.index, d->info.name,
            d->info.driver_name, d->info.driver_info,
            d->cm.kind == VKD_CM_NV ? "NV cooperative matrices" : d->cm.kind == VKD_CM_EMULATED ? "emulated "
            "cooperative matrices" : "FP32", d->cm.m, d->cm.n, d->cm.k);
    *out = d;
    return VKI_OK;
}

void vkd_close(vkd_device *d)
{
    if (!d)
        return;
    if (d->dev) {
        vkDeviceWaitIdle(d->dev);
        vkd_kernels_destroy(d);
        vkd_buffer_destroy(d, d->split_part);
        vkd_buffer_destroy(d, d->split_cnt);
        save_pipeline_cache(d);
        if (d->pipeline_cache)
            vkDestroyPipelineCache(d->dev, d->pipeline_cache, NULL);
        vkd_memory_shutdown(d);
        if (d->cmd_pool)
            vkDestroyCommandPool(d->dev, d->cmd_pool, NULL);
        vkDestroyDevice(d->dev, NULL);
    }
    if (d->messenger) {
        PFN_vkDestroyDebugUtilsMessengerEXT destroy = (PFN_vkDestroyDebugUtilsMessengerEXT)
            vkGetInstanceProcAddr(d->instance, "vkDestroyDebugUtilsMessengerEXT");
        if (destroy)
            destroy(d->instance, d->messenger, NULL);
    }
    if (d->instance)
        vkDestroyInstance(d->instance, NULL);
    free(d);
}

/* ---- listing for `vkinfer info` -------------------------------------------------------------- */

vki_status vki_list_devices(vki_device_info *out, uint32_t cap, uint32_t *n_out)
{
    *n_out = 0;
    vkd_device tmp = {.log = log_none, .log_level = VKI_LOG_ERROR};
    bool debug_utils = false;
    vki_status st = create_instance(&tmp, false, &debug_utils);
    if (st != VKI_OK)
        return st;
    VkPhysicalDevice *pds = NULL;
    uint32_t n = 0;
    st = enumerate(&tmp, &pds, &n);
    if (st == VKI_OK) {
        for (uint32_t i = 0; i < n && i < cap; i++) {
            bool oom;
            describe_device(tmp.instance, pds[i], i, &out[i], &oom);
            if (oom)
                st = VKI_ERR_OUT_OF_HOST_MEMORY;
            out[i].debug_utils = debug_utils;
        }
        *n_out = n;
    }
    free(pds);
    vkDestroyInstance(tmp.instance, NULL);
    return st;
}
