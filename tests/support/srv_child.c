#include "support/srv_child.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

pid_t srvc_spawn(const char *model, const char *log, const char *const *args, uint16_t *port)
{
    const char *argv[64] = {NULL};
    char exe[1024];
    snprintf(exe, sizeof exe, "%s/vkinfer", VKI_BINARY_DIR);
    int n = 0;
    const char *fixed[] = {exe, "serve", "-m", model, "--port", "0", "--no-progress"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        argv[n++] = fixed[i];
    for (size_t i = 0; args && args[i] && n < 63; i++)
        argv[n++] = args[i];
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) { /* stdout too: an inherited pipe would outlive the test */
            dup2(fd, 1);
            dup2(fd, 2);
        }
        /* Under AddressSanitizer freed memory waits in a quarantine (256 MiB by default) that
         * would count as growth: keep it small so memory bounds measure the server. Leak checking
         * is off in the child: the Vulkan driver, unloaded at exit, leaves allocations no
         * suppression can name (the in-process suites check the server's leaks). */
        char asan[512];
        const char *prev = getenv("ASAN_OPTIONS");
        snprintf(asan, sizeof asan, "%s%squarantine_size_mb=4:thread_local_quarantine_size_kb=64:detect_leaks=0",
                 prev ? prev : "", prev && *prev ? ":" : "");
        setenv("ASAN_OPTIONS", asan, 1);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    *port = 0;
    for (double end = now_s() + 120; !*port && now_s() < end; usleep(20000)) {
        FILE *f = fopen(log, "r");
        char line[1024];
        while (f && !*port && fgets(line, sizeof line, f)) {
            const char *l = strstr(line, "listening on http://");
            const char *c = l ? strrchr(l, ':') : NULL;
            if (c)
                *port = (uint16_t)atoi(c + 1);
        }
        if (f)
            fclose(f);
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            fail_msg("vkinfer serve exited (built %s/vkinfer? see %s)", VKI_BINARY_DIR, log);
    }
    if (!*port) {
        srvc_kill(pid);
        fail_msg("vkinfer serve did not start (see %s)", log);
    }
    return pid;
}

int srvc_stop(pid_t pid)
{
    int status = 0;
    kill(pid, SIGTERM);
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void srvc_kill(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static long status_field(pid_t pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n))
            v = strtol(line + n, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

long srvc_rss_kib(pid_t pid) { return status_field(pid, "VmRSS:"); }

int srvc_threads(pid_t pid) { return (int)status_field(pid, "Threads:"); }

int srvc_log_has(const char *log, const char *const *needles)
{
    FILE *f = fopen(log, "r");
    char line[4096];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        found = 1;
        for (size_t i = 0; needles[i] && found; i++)
            found = strstr(line, needles[i]) != NULL;
    }
    if (f)
        fclose(f);
    return found;
}
