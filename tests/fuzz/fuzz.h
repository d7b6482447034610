/* libFuzzer harnesses (tests/fuzz/fuzz_*.c). Each defines LLVMFuzzerTestOneInput and may define
 * fuzz_init (run once before the first input). Built two ways (tests/fuzz/CMakeLists.txt):
 *  - with clang -fsanitize=fuzzer by `tools/dev fuzz` (coverage-guided runs);
 *  - with replay.c's main() in every normal build, where ctest replays the committed regression
 *    inputs (tests/fuzz/regress/<target>/) and a fresh seed corpus, so a crash that was fixed
 *    stays fixed under the Release and sanitizer builds too.
 * A harness must not leak, must not print, and aborts (FUZZ_CHECK) only when a property of the
 * code under test is broken. */
#ifndef VKI_TESTS_FUZZ_H
#define VKI_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FUZZ_CHECK(cond)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "%s:%d: property broken: %s\n", __FILE__, __LINE__, #cond);         \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

/* Where ../shared/models is (compiled in; the VKI_SHARED_DIR environment variable overrides). */
const char *fuzz_shared_dir(void);

#endif
