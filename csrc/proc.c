/*
 * proc.c: reading /proc, shared by the core (the group check, the drain's look
 * for pipe holders) and the supervisor (the last kill's walk of a dying tree).
 */
#include "bp_internal.h"

#ifdef __linux__
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* bp__proc_stat: from /proc/NAME/stat (NAME a pid's digits), the state letter, the
 * parent's pid and the process group.  0, or -1 when it cannot be read. */
int bp__proc_stat(const char *name, char *state, int *ppid, int *pgrp)
{
    char path[64];
    char buf[512];
    size_t nl = strlen(name);
    if (nl > 20)
        return -1;
    memcpy(path, "/proc/", 6);
    memcpy(path + 6, name, nl);
    memcpy(path + 6 + nl, "/stat", 6);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n;
    do {
        n = read(fd, buf, sizeof buf - 1);
    } while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    /* comm may hold spaces and parentheses: the fields resume after the last ')'. */
    char *rp = strrchr(buf, ')');
    if (rp == NULL || sscanf(rp + 1, " %c %d %d", state, ppid, pgrp) != 3)
        return -1;
    return 0;
}
#endif
