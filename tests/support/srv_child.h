/* `vkinfer serve` as a child process, for the tests that need a server in its own process (its
 * thread count, its file descriptors, the signals it takes, a load that would swamp the test's own
 * threads): start it on a free port with its stderr in a log file, read its resident memory and
 * thread count, stop it. */
#ifndef VKI_TESTS_SRV_CHILD_H
#define VKI_TESTS_SRV_CHILD_H

#include <stdint.h>
#include <sys/types.h>

/* Starts `vkinfer serve -m model --port 0 --no-progress <args...>` (args NULL-terminated, may be
 * NULL), stderr and stdout into log; waits for its "listening on" line and returns its pid with
 * *port. Fails the test when it does not come up. */
pid_t srvc_spawn(const char *model, const char *log, const char *const *args, uint16_t *port);
/* SIGTERM, then waits; returns the exit status (-1 when it did not exit normally). */
int srvc_stop(pid_t pid);
void srvc_kill(pid_t pid);                 /* SIGKILL and reap (a failed test's cleanup) */
long srvc_rss_kib(pid_t pid);              /* VmRSS, -1 if unknown */
int srvc_threads(pid_t pid);               /* Threads, -1 if unknown */
/* Whether the log file holds a line containing every one of the NULL-terminated needles. */
int srvc_log_has(const char *log, const char *const *needles);

#endif
