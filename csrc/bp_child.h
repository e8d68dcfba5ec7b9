/*
 * bp_child.h: what the core's vfork child (spawn.c) does before exec.  The
 * contained path (contain.c) does the same with raw system calls instead.
 *
 * Everything here runs between vfork() and execve(): async-signal-safe
 * calls only, no allocation, nothing written that the parent reads.
 */
#ifndef BP_CHILD_H
#define BP_CHILD_H

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/syscall.h>
#endif

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* Every disposition back to its default: Python ignores SIGPIPE, and a
 * check must not inherit that (nor any handler, which exec resets anyway). */
static inline void bp_child_default_signals(void)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        (void)sigaction(sig, &dfl, NULL);
    }
}

/* Make in, out, err the child's 0, 1, 2 (each above 2, or -1 for a stream
 * to leave closed).  Returns 0, or -1 with errno set. */
static inline int bp_child_stdio(int in, int out, int err)
{
    int src[3] = {in, out, err};
    for (int fd = 0; fd < 3; fd++) {
        if (src[fd] < 0) {
            (void)close(fd);
        } else if (dup2(src[fd], fd) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Leave only 0, 1, 2 and keep (which must be close-on-exec) open across
 * exec: every other fd is marked close-on-exec (or, without close_range,
 * closed). */
static inline void bp_child_close_fds(int keep)
{
#if defined(__linux__) && defined(SYS_close_range)
    if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
        return;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > (1L << 20))
        max = 1L << 20;
    for (int fd = 3; fd < (int)max; fd++)
        if (fd != keep)
            close(fd);
}

/* Try each candidate path as execvp does, except that ENOEXEC is reported
 * and never retried through /bin/sh.  Returns only on failure, with the
 * errno to report (EACCES if any candidate was not executable). */
static inline int bp_child_exec(char *const *paths, char *const *argv, char *const *envp)
{
    int saw_eacces = 0;
    int last = ENOENT;
    for (char *const *p = paths; *p != NULL; p++) {
        execve(*p, argv, envp);
        int e = errno;
        switch (e) {
        case EACCES:
            saw_eacces = 1;
            last = e;
            continue;
        case ENOENT:
        case ENOTDIR:
        case ELOOP:
        case ENAMETOOLONG:
        case ESTALE:
        case ENODEV:
        case ETIMEDOUT:
            if (!saw_eacces)
                last = e;
            continue;
        default:
            return e;
        }
    }
    return saw_eacces ? EACCES : last;
}

#endif
