/*
 * LD_PRELOAD shim for Baton's local stack: a bind() to a wildcard address
 * (0.0.0.0 or ::) is pinned to loopback, so that every process Baton starts
 * (Ray's GCS, raylet, agents and workers, the Mooncake master and store, the
 * vLLM engines) listens on loopback only, whatever its own defaults are.
 * Ray's and Mooncake's C++ servers bind wildcards with no option to change
 * that; see docs/security.md.
 *
 * IPv4 0.0.0.0 becomes 127.0.0.1. An IPv6 wildcard becomes ::ffff:127.0.0.1
 * (a dual-stack socket then still accepts IPv4 clients of 127.0.0.1, as gRPC
 * servers that bind [::] expect), or ::1 when the socket is IPv6-only.
 * Every other address, and every non-IP socket, is left alone, and so are
 * the ports listed in BATON_BIND_EXEMPT_PORTS (comma-separated: the public
 * endpoint when the config asks for it on every interface).
 * BATON_BIND_LOG=1 logs each rewrite to stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

static bind_fn real_bind(void) {
    static bind_fn fn;
    if (!fn) fn = (bind_fn)dlsym(RTLD_NEXT, "bind");
    return fn;
}

static int exempt(in_port_t port_be) {
    const char *list = getenv("BATON_BIND_EXEMPT_PORTS");
    unsigned port = ntohs(port_be);
    if (!list || port == 0) return 0;
    while (*list) {
        char *end;
        unsigned long p = strtoul(list, &end, 10);
        if (end == list) return 0;
        if (p == port) return 1;
        list = *end == ',' ? end + 1 : end;
    }
    return 0;
}

static void note(int fd, const char *to) {
    const char *log = getenv("BATON_BIND_LOG");
    if (log && *log == '1') fprintf(stderr, "baton bind_loopback: fd %d wildcard -> %s\n", fd, to);
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY) && !exempt(a.sin_port)) {
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            note(fd, "127.0.0.1");
            return real_bind()(fd, (const struct sockaddr *)&a, sizeof a);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (memcmp(&a.sin6_addr, &in6addr_any, sizeof a.sin6_addr) == 0 && !exempt(a.sin6_port)) {
            int v6only = 0;
            socklen_t n = sizeof v6only;
            if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &n) == 0 && v6only) {
                a.sin6_addr = in6addr_loopback;
                note(fd, "::1");
            } else {
                memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
                a.sin6_addr.s6_addr[10] = 0xff;
                a.sin6_addr.s6_addr[11] = 0xff;
                a.sin6_addr.s6_addr[12] = 127;
                a.sin6_addr.s6_addr[15] = 1;
                note(fd, "::ffff:127.0.0.1");
            }
            return real_bind()(fd, (const struct sockaddr *)&a, sizeof a);
        }
    }
    return real_bind()(fd, addr, len);
}
