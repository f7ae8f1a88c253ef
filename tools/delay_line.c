/* A userspace netem for a kernel without sch_netem: one process holds a TAP device in each of
 * several network namespaces and forwards every frame to the TAP its destination MAC was learnt on
 * (to every other TAP when unknown or broadcast), as a switch would, after DELAY, each port's link
 * holding RATE both ways: a frame is serialised on its sender's link into the relay, then on the
 * receiver's link out of it (store and forward), and delivered DELAY after it left the sender.
 * Each port queues at most QUEUE frames (netem's default limit); past that a frame is dropped.
 *
 *     delay_line DELAY_NS RATE_BIT_S /run/netns/NS1:TAP1 /run/netns/NS2:TAP2 ...
 *
 * RATE_BIT_S 0: no rate limit. Prints "ready" once every TAP is attached; on SIGTERM or SIGINT it
 * prints what it forwarded and dropped to stderr and exits; also when the process that started it
 * ends or a TAP goes away. Built by tools/rank_links.py. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define MAX_PORTS 16
#define QUEUE 1000
#define SLOT 2048 /* a TAP without offloads gives frames of at most its MTU (1500) + 14 */
#define MACS 256

typedef struct {
    uint64_t at; /* when it leaves the relay */
    uint32_t len;
} Frame;

typedef struct {
    int fd;
    uint64_t up_free, down_free; /* when the port's link is free again, each way */
    Frame queue[QUEUE];
    unsigned char *data; /* QUEUE slots of SLOT bytes */
    unsigned head, count;
} Port;

static Port ports[MAX_PORTS];
static int port_count;
static unsigned char macs[MACS][6];
static int mac_ports[MACS], mac_count;
static uint64_t delay_ns, forwarded, dropped;
static double ns_per_byte; /* 0: no rate */
static volatile sig_atomic_t stopping;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void stop(int sig) {
    (void)sig;
    stopping = 1;
}

static int attach(const char *spec) {
    char path[256];
    const char *colon = strrchr(spec, ':');
    if (!colon || (size_t)(colon - spec) >= sizeof path || strlen(colon + 1) >= IFNAMSIZ) return -1;
    memcpy(path, spec, (size_t)(colon - spec));
    path[colon - spec] = 0;
    int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) return -1;
    close(ns);
    /* The fd stays bound to the TAP of that namespace whatever namespace the process is in. */
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    strcpy(ifr.ifr_name, colon + 1);
    if (fd < 0 || ioctl(fd, TUNSETIFF, &ifr) != 0) return -1;
    return fd;
}

static int port_of(const unsigned char *mac) {
    for (int i = 0; i < mac_count; i++)
        if (memcmp(macs[i], mac, 6) == 0) return mac_ports[i];
    return -1;
}

static void learn(const unsigned char *mac, int port) {
    if (mac[0] & 1) return; /* a group address is never a source */
    for (int i = 0; i < mac_count; i++)
        if (memcmp(macs[i], mac, 6) == 0) {
            mac_ports[i] = port;
            return;
        }
    if (mac_count < MACS) {
        memcpy(macs[mac_count], mac, 6);
        mac_ports[mac_count++] = port;
    }
}

static void enqueue(int to, const unsigned char *frame, uint32_t len, uint64_t sent) {
    Port *p = &ports[to];
    if (p->count == QUEUE) {
        dropped++;
        return;
    }
    uint64_t start = sent + delay_ns > p->down_free ? sent + delay_ns : p->down_free;
    p->down_free = start + (uint64_t)(len * ns_per_byte);
    unsigned slot = (p->head + p->count++) % QUEUE;
    p->queue[slot] = (Frame){p->down_free, len};
    memcpy(p->data + (size_t)slot * SLOT, frame, len);
}

static void arrive(int from, const unsigned char *frame, uint32_t len, uint64_t now) {
    if (len < 14) return;
    Port *p = &ports[from];
    /* Serialised on the sender's link into the relay. */
    p->up_free = (now > p->up_free ? now : p->up_free) + (uint64_t)(len * ns_per_byte);
    learn(frame + 6, from);
    int to = (frame[0] & 1) ? -1 : port_of(frame);
    if (to == from) return;
    for (int i = 0; i < port_count; i++)
        if (i != from && (to < 0 || i == to)) enqueue(i, frame, len, p->up_free);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: delay_line DELAY_NS RATE_BIT_S NETNS:TAP NETNS:TAP [...]\n");
        return 2;
    }
    delay_ns = strtoull(argv[1], NULL, 10);
    double rate = strtod(argv[2], NULL);
    ns_per_byte = rate > 0 ? 8e9 / rate : 0;
    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    for (int i = 3; i < argc && port_count < MAX_PORTS; i++) {
        Port *p = &ports[port_count];
        p->fd = attach(argv[i]);
        p->data = malloc((size_t)QUEUE * SLOT);
        if (p->fd < 0 || !p->data) {
            fprintf(stderr, "delay_line: cannot attach %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        port_count++;
    }
    if (home >= 0) setns(home, CLONE_NEWNET);
    /* The delay is a fraction of a millisecond: wake on time (no timer slack) and ahead of the
     * machine's other work when it can (root); it sleeps whenever nothing is due. */
    prctl(PR_SET_TIMERSLACK, 1UL);
    struct sched_param fifo = {.sched_priority = 10};
    sched_setscheduler(0, SCHED_FIFO, &fifo);
    struct sigaction sa = {.sa_handler = stop};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* the tool gone (even killed): nothing left running */
    if (getppid() == 1) return 0;
    printf("ready\n");
    fflush(stdout);

    struct pollfd fds[MAX_PORTS];
    for (int i = 0; i < port_count; i++) fds[i] = (struct pollfd){ports[i].fd, POLLIN, 0};
    static unsigned char frame[65536];
    while (!stopping) {
        uint64_t now = now_ns(), next = UINT64_MAX;
        for (int i = 0; i < port_count; i++) {
            Port *p = &ports[i];
            while (p->count && p->queue[p->head].at <= now) {
                Frame *f = &p->queue[p->head];
                if (write(p->fd, p->data + (size_t)p->head * SLOT, f->len) == (ssize_t)f->len) forwarded++;
                else dropped++;
                p->head = (p->head + 1) % QUEUE;
                p->count--;
            }
            if (p->count && p->queue[p->head].at < next) next = p->queue[p->head].at;
        }
        struct timespec wait, *timeout = NULL;
        if (next != UINT64_MAX) {
            uint64_t left = next > now ? next - now : 0;
            wait = (struct timespec){(time_t)(left / 1000000000u), (long)(left % 1000000000u)};
            timeout = &wait;
        }
        if (ppoll(fds, (nfds_t)port_count, timeout, NULL) < 0 && errno != EINTR) break;
        for (int i = 0; i < port_count; i++) {
            if (fds[i].revents & (POLLERR | POLLHUP | POLLNVAL)) {
                /* A TAP gone (its namespace deleted): stop, rather than spin at real-time priority. */
                fprintf(stderr, "delay_line: port %d closed\n", i);
                stopping = 1;
            }
            if (!(fds[i].revents & POLLIN)) continue;
            for (int n = 0; n < 64; n++) { /* a burst at a time: the others' frames wait no longer */
                ssize_t len = read(ports[i].fd, frame, sizeof frame);
                if (len <= 0) break;
                if (len > SLOT) {
                    dropped++;
                    continue;
                }
                arrive(i, frame, (uint32_t)len, now_ns());
            }
        }
    }
    fprintf(stderr, "delay_line: %llu frames forwarded, %llu dropped\n", (unsigned long long)forwarded,
            (unsigned long long)dropped);
    return 0;
}
