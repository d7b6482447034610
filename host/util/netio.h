/* Blocking socket writes shared by the HTTP server's handler threads and the load generator. */
#ifndef VKI_HOST_NETIO_H
#define VKI_HOST_NETIO_H

#include <stdbool.h>
#include <stddef.h>

/* Writes all n bytes to the socket (retrying short writes and EINTR, no SIGPIPE). false on an
 * error or the socket's send timeout; how much went out is then unknown. */
bool net_send_all(int fd, const void *p, size_t n);

#endif
