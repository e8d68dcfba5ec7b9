/*
 * kill.c: end the run: signal the group, reap the leader, fill the result.
 *
 * The group id is the leader's pid.  The group is signalled only while the
 * leader is unreaped: a zombie leader keeps its pid, so the group id cannot be
 * handed to an unrelated process group while we might still signal it.
 */
#include "bp_internal.h"
#include "bp_supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

/* Send sig to the run's process group (to the leader alone when it shares
 * our group), only while the leader is unreaped. */
void bp__signal_group(struct bp_run *run, int sig)
{
    if (run->pid <= 0 || run->reaped)
        return;
    if (sig == SIGKILL)
        run->sigkill_sent = 1;
    if (run->sup != NULL) {
        bp__sup_signal(run, sig);  /* it holds the leader unreaped and signals for us */
        return;
    }
    (void)kill(run->spec->new_session ? -run->pid : run->pid, sig);
}

void bp__record_status(struct bp_result *res, int status)
{
    if (WIFEXITED(status)) {
        res->exit_code = WEXITSTATUS(status);
        res->term_signal = 0;
    } else if (WIFSIGNALED(status)) {
        res->term_signal = WTERMSIG(status);
        res->exit_code = 128 + res->term_signal;
    }
    res->raw_exit_code = res->exit_code;
}

static double tv_seconds(struct timeval tv)
{
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

/*
 * Reap the leader (blocking) and record its status and resource use.
 * Returns 0, or -1 with errno set if wait4 failed for a reason other than
 * EINTR (then err_stage is BP_STAGE_WAIT).  Joins the exit watcher thread
 * first, so that it can never wait on a later child that reuses the pid.
 */
int bp__reap(struct bp_run *run)
{
    if (run->pid <= 0 || run->reaped)
        return 0;
    if (run->sup != NULL)
        return bp__sup_reap(run);
    if (run->watcher_started) {
        pthread_join(run->watcher, NULL);
        run->watcher_started = 0;
    }
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    pid_t r;
    do {
        r = wait4(run->pid, &status, 0, &ru);
    } while (r < 0 && errno == EINTR);
    run->reaped = 1;
    bp__close_fd(&run->exit_fd);
    bp__close_fd(&run->watch_pipe_w);
    struct bp_result *res = run->res;
    if (r < 0) {
        int e = errno;
        if (res->err_stage == BP_STAGE_NONE) {
            res->err_stage = BP_STAGE_WAIT;
            res->err_errno = e;
        }
        errno = e;
        return -1;
    }
    bp__record_status(res, status);
    res->user_time = tv_seconds(ru.ru_utime);
    res->system_time = tv_seconds(ru.ru_stime);
#ifdef __APPLE__
    res->max_rss = (int64_t)ru.ru_maxrss;
#else
    res->max_rss = (int64_t)ru.ru_maxrss * 1024;
#endif
    return 0;
}

/* Apply the exit-code rules of SPEC 2.4 once the run is over. */
void bp__finish_result(struct bp_run *run)
{
    struct bp_result *res = run->res;
    bp__output_finish(run);  /* kept lengths, bytes read, gaps */
    if (!res->spawned)
        return;
    switch (res->end_reason) {
    case BP_END_DEADLINE:
        res->timed_out = 1;
        res->exit_code = BP_DEADLINE_EXIT_CODE;
        break;
    case BP_END_CANCEL:
        res->cancelled = 1;
        res->exit_code = BP_CANCEL_EXIT_CODE;
        break;
    case BP_END_OVERFLOW:
        res->exit_code = BP_OVERFLOW_EXIT_CODE;
        if (res->term_signal == 0)
            res->term_signal = SIGKILL;
        break;
    case BP_END_ABORT:
        if (res->exit_code == 0)
            res->exit_code = BP_CANCEL_EXIT_CODE;
        break;
    default:
        break;
    }
}

#ifdef __linux__
/* Read /proc/PID/stat and return 1 when it is a live member of pgid. */
static int live_member(const char *name, int pgid)
{
    char path[64];
    char buf[512];
    size_t nl = strlen(name);
    if (nl > 20)
        return 0;
    memcpy(path, "/proc/", 6);
    memcpy(path + 6, name, nl);
    memcpy(path + 6 + nl, "/stat", 6);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n;
    do {
        n = read(fd, buf, sizeof buf - 1);
    } while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* comm may hold spaces and parentheses: the fields resume after the last ')'. */
    char *rp = strrchr(buf, ')');
    if (rp == NULL)
        return 0;
    char state = 0;
    int ppid = 0, pgrp = 0;
    if (sscanf(rp + 1, " %c %d %d", &state, &ppid, &pgrp) != 3)
        return 0;
    return pgrp == pgid && state != 'Z' && state != 'X' && state != 'x';
}
#endif

/*
 * bp_group_alive: 1 if a process other than a zombie is in process group
 * pgid, 0 if none is.  Where this cannot be known (no /proc), returns 1 when
 * kill(-pgid, 0) succeeds.  Never signals anything.  errno is preserved.
 */
int bp_group_alive(int pgid)
{
    int saved = errno;
    int alive = 0;
#ifdef __linux__
    DIR *d = opendir("/proc");
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] < '0' || e->d_name[0] > '9')
                continue;
            if (live_member(e->d_name, pgid)) {
                alive = 1;
                break;
            }
        }
        closedir(d);
        errno = saved;
        return alive;
    }
#endif
    alive = kill(-(pid_t)pgid, 0) == 0;
    errno = saved;
    return alive;
}
