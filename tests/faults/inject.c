/*
 * A fault injector for tests/test_faults.py: LD_PRELOADed into a Python child, it makes
 * one chosen libc call of the core fail, once, when the child arms it through ctypes
 * (bp_fault_arm).  The commands the child runs load it too, and are never armed; the
 * supervisor program is linked statically and never loads it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* 0: off; 1: the next read of a pipe fails with EIO; 2: the next poll whose first fd
 * is a SOCK_SEQPACKET socket (the core's wait on its supervisor) fails with ENOMEM. */
static volatile int mode;
static volatile int fired;

void bp_fault_arm(int m) { fired = 0; mode = m; }
int bp_fault_fired(void) { return fired; }

static int is_fifo(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

static int is_seqpacket(int fd)
{
    int type = 0;
    socklen_t len = sizeof type;
    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_SEQPACKET;
}

ssize_t read(int fd, void *buf, size_t n)
{
    static ssize_t (*real)(int, void *, size_t);
    if (real == NULL)
        real = (ssize_t (*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
    if (mode == 1 && !fired && is_fifo(fd)) {
        fired = 1;
        errno = EIO;
        return -1;
    }
    return real(fd, buf, n);
}

int poll(struct pollfd *fds, nfds_t n, int timeout)
{
    static int (*real)(struct pollfd *, nfds_t, int);
    if (real == NULL)
        real = (int (*)(struct pollfd *, nfds_t, int))dlsym(RTLD_NEXT, "poll");
    if (mode == 2 && !fired && n > 0 && timeout != 0 && is_seqpacket(fds[0].fd)) {
        fired = 1;
        errno = ENOMEM;
        return -1;
    }
    return real(fds, n, timeout);
}
