/*
 * LD_PRELOAD shim for Baton's local stack: a bind() to a wildcard address
 * (0.0.0.0 or ::) is pinned to loopback, so that every process Baton starts
 * (Ray's GCS, raylet, agents and workers, the Mooncake master and store, the
 * vLLM engines) listens on loopback only, whatever its own defaults are.
 * Ray's and Mooncake's C++ servers bind wildcards with no option to change
 * that; see docs/security.md.
 *
 * IPv4 0.0.0.0 becomes 127.0.0.1, or the IPv4 address in BATON_BIND_ADDRESS
 * (a cluster node's private IP: the node scripts pin Mooncake there). An IPv6
 * wildcard becomes the same address IPv4-mapped (::ffff:127.0.0.1: a
 * dual-stack socket then still accepts IPv4 clients, as gRPC servers that
 * bind [::] expect), or ::1 when the socket is IPv6-only.
 * Every other address, and every non-IP socket, is left alone, and so are
 * the ports listed in BATON_BIND_EXEMPT_PORTS (comma-separated: the public
 * endpoint when the config asks for it on every interface).
 * BATON_BIND_LOG=1 logs each rewrite to stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <arpa/inet.h>
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

static struct in_addr target(void) {
    struct in_addr a;
    const char *env = getenv("BATON_BIND_ADDRESS");
    if (!env || !*env || inet_pton(AF_INET, env, &a) != 1) a.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static void note(int fd, struct in_addr to, int v6) {
    const char *log = getenv("BATON_BIND_LOG");
    char buf[INET_ADDRSTRLEN] = "?";
    if (!log || *log != '1') return;
    inet_ntop(AF_INET, &to, buf, sizeof buf);
    fprintf(stderr, "baton bind_loopback: fd %d wildcard -> %s%s\n", fd, v6 ? "::ffff:" : "", buf);
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY) && !exempt(a.sin_port)) {
            a.sin_addr = target();
            note(fd, a.sin_addr, 0);
            return real_bind()(fd, (const struct sockaddr *)&a, sizeof a);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (memcmp(&a.sin6_addr, &in6addr_any, sizeof a.sin6_addr) == 0 && !exempt(a.sin6_port)) {
            int v6only = 0;
            socklen_t n = sizeof v6only;
            struct in_addr to = target();
            if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &n) == 0 && v6only) {
                a.sin6_addr = in6addr_loopback;  /* an IPv6-only socket has no IPv4 address */
            } else {
                memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
                a.sin6_addr.s6_addr[10] = 0xff;
                a.sin6_addr.s6_addr[11] = 0xff;
                memcpy(&a.sin6_addr.s6_addr[12], &to, 4);
                note(fd, to, 1);
            }
            return real_bind()(fd, (const struct sockaddr *)&a, sizeof a);
        }
    }
    return real_bind()(fd, addr, len);
}
