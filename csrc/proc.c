/*
 * proc.c: reading /proc, shared by the core (the group check, the drain's look
 * for pipe holders) and the supervisor (the last kill's walk of a dying tree).
 */
#include "bp_internal.h"

#ifdef __linux__
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* bp__read_small: the first size - 1 bytes (at most) of the file at path, with a NUL
 * after them: their count, or -1 when it cannot be read (or is empty). */
ssize_t bp__read_small(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n;
    do {
        n = read(fd, buf, size - 1);
    } while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return n;
}

/* bp__proc_stat: from /proc/NAME/stat (NAME a pid's digits), the state letter, the
 * parent's pid, the process group and the kernel's flags (flags may be NULL).  0, or -1
 * when it cannot be read. */
int bp__proc_stat(const char *name, char *state, int *ppid, int *pgrp, unsigned *flags)
{
    char path[64];
    char buf[512];
    unsigned ignored = 0;
    if (strlen(name) > 20)
        return -1;
    (void)snprintf(path, sizeof path, "/proc/%s/stat", name);
    if (bp__read_small(path, buf, sizeof buf) < 0)
        return -1;
    /* comm may hold spaces and parentheses: the fields resume after the last ')'. */
    char *rp = strrchr(buf, ')');
    if (rp == NULL || sscanf(rp + 1, " %c %d %d %*d %*d %*d %u", state, ppid, pgrp,
                             flags != NULL ? flags : &ignored) != 4)
        return -1;
    return 0;
}

#define BP_PF_EXITING 0x4u  /* the kernel's PF_EXITING, in /proc/PID/stat's flags */

/* Whether /proc/NAME/status shows a SIGKILL pending (its thread's or the process's). */
static int sigkill_pending(const char *name)
{
    char path[64], buf[4096];
    (void)snprintf(path, sizeof path, "/proc/%.20s/status", name);
    if (bp__read_small(path, buf, sizeof buf) < 0)
        return 0;
    static const char *const keys[] = {"\nSigPnd:", "\nShdPnd:"};
    for (int i = 0; i < 2; i++) {
        const char *at = strstr(buf, keys[i]);
        unsigned long long mask = 0;
        if (at != NULL && sscanf(at + strlen(keys[i]), " %llx", &mask) == 1
                && (mask & (1ULL << (SIGKILL - 1))) != 0)
            return 1;
    }
    return 0;
}

/* bp__proc_exiting: whether a process whose stat state and flags were just read
 * (bp__proc_stat) is past the point of no return: in the kernel's exit (freeing its
 * memory, releasing its files) or a zombie. */
int bp__proc_exiting(char state, unsigned flags)
{
    return state == 'Z' || state == 'X' || state == 'x' || (flags & BP_PF_EXITING) != 0;
}

/* bp__proc_exiting_child: whether process pid is still parent's child and exiting
 * (bp__proc_exiting): a contained run's leader that its supervisor has yet to reap. */
int bp__proc_exiting_child(pid_t pid, pid_t parent)
{
    char name[24], state = 0;
    int ppid = 0, pgrp = 0;
    unsigned flags = 0;
    if (pid <= 0 || parent <= 0)
        return 0;
    (void)snprintf(name, sizeof name, "%d", (int)pid);
    return bp__proc_stat(name, &state, &ppid, &pgrp, &flags) == 0 && ppid == (int)parent
           && bp__proc_exiting(state, flags);
}

/* bp__proc_dying: whether process NAME, whose stat state and flags were just read
 * (bp__proc_stat), is on its way out: exiting (bp__proc_exiting), or with a SIGKILL
 * pending that it has not yet been scheduled to act on. */
int bp__proc_dying(const char *name, char state, unsigned flags)
{
    return bp__proc_exiting(state, flags) || sigkill_pending(name);
}
#endif
