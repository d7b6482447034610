/* Embedding the HTTP server: the program loads a model itself and serves it as "story" through
 * the OpenAI and KServe v2 routes, next to a model repository folder when one is given. Without
 * --serve it asks itself one question over HTTP (a plain socket, as any client would) and exits.
 *   cc server.c $(pkg-config --cflags --libs vkinfer-server) -o server
 *   ./server model.gguf [--serve PORT] [--repository DIR] */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vkinfer_server.h>

static void log_line(void *user, vki_log_level level, const char *msg)
{
    (void)user, (void)level;
    fprintf(stderr, "server: %s\n", msg);
}

/* POSTs body to path on 127.0.0.1:port and prints the answer (HTTP/1.1, Connection: close). */
static int ask(uint16_t port, const char *path, const char *body)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("connect");
        return 1;
    }
    char req[1024];
    int n = snprintf(req, sizeof req,
                     "POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     path, strlen(body), body);
    if (write(fd, req, (size_t)n) != n) {
        perror("write");
        close(fd);
        return 1;
    }
    char buf[4096];
    ssize_t got;
    while ((got = read(fd, buf, sizeof buf)) > 0)
        fwrite(buf, 1, (size_t)got, stdout);
    printf("\n");
    close(fd);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [--serve PORT] [--repository DIR]\n", argv[0]);
        return 2;
    }
    int serve_port = -1;
    vki_server_params sp = vki_server_default_params();
    sp.port = 0; /* any free port, unless --serve */
    sp.log = log_line;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--serve"))
            sp.port = (uint16_t)(serve_port = atoi(argv[i + 1]));
        else if (!strcmp(argv[i], "--repository"))
            sp.model_repository = argv[i + 1];
    }
    char err[512];
    vki_engine_params ep = vki_engine_default_params();
    ep.kv_tokens = 4096;
    vki_engine *engine;
    if (vki_engine_create(argv[1], &ep, &engine, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], err);
        return 1;
    }
    vki_server *srv;
    if (vki_server_create(&sp, &srv, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "server: %s\n", err);
        vki_engine_destroy(engine);
        return 1;
    }
    int rc = 0;
    if (vki_server_add_model(srv, "story", engine, NULL, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "add_model: %s\n", err);
        rc = 1;
    } else if (serve_port >= 0) {
        sigset_t set; /* until Ctrl-C or SIGTERM */
        sigemptyset(&set);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
        fprintf(stderr, "serving 'story' on port %u\n", vki_server_port(srv));
        int sig;
        sigwait(&set, &sig);
    } else {
        uint16_t port = vki_server_port(srv);
        rc = ask(port, "/v1/completions",
                 "{\"model\":\"story\",\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0}") ||
             ask(port, "/v2/models/story/generate",
                 "{\"text_input\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0}");
    }
    vki_server_drain(srv, 30);
    vki_server_destroy(srv); /* before the engine it serves */
    vki_engine_destroy(engine);
    return rc;
}
