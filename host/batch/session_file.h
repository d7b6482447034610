/* Session file format constants (docs/session-file.md): the reader and writer
 * (batch_session_file.c) and the fuzz harness that forges files (tests/fuzz/fuzz_session.c). */
#ifndef VKI_HOST_BATCH_SESSION_FILE_H
#define VKI_HOST_BATCH_SESSION_FILE_H

#define SF_MAGIC "VKISESS\x1a"
#define SF_VERSION 1u
#define SF_HEADER 128u           /* bytes of the header, its checksum (the last 8) included */
#define SF_NAME 60u              /* model name field at offset 24 (NUL-padded) */
#define SF_SEED_HEADER 0x53455353484452ull   /* hash seed of the header checksum */
#define SF_SEED_FILE 0x5345535346494c45ull   /* hash seed of the file checksum */

#endif
