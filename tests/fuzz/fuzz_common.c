/* Shared by every harness: the shared-models folder. */
#include "fuzz.h"

const char *fuzz_shared_dir(void)
{
    const char *e = getenv("VKI_SHARED_DIR");
    return e && *e ? e : VKI_SHARED_DIR;
}
