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
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

/* 1 while the run has a leader to signal or reap: started here, or handed
 * to a supervisor that has not reported its exec yet (sup_pending). */
int bp__has_leader(const struct bp_run *run)
{
    return (run->pid > 0 || run->sup_pending) && !run->reaped;
}

/* Send sig to the run's process group (to the leader alone when it shares
 * our group), only while the leader is unreaped. */
void bp__signal_group(struct bp_run *run, int sig)
{
    if (!bp__has_leader(run))
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

/* The leader's status is lost (its supervisor failed, or someone else reaped
 * it): the run reports what a kill would, never 0 (SPEC 9.2). */
void bp__record_unknown_status(struct bp_result *res)
{
    if (res->raw_exit_code < 0) {
        res->exit_code = 128 + SIGKILL;
        res->term_signal = SIGKILL;
    }
}

/*
 * A child's wait status from its pidfd after someone else reaped it (an
 * ignored SIGCHLD has the kernel do so): Linux 6.15's PIDFD_INFO_EXIT; the
 * headers may predate it.  Returns 1 with *status set, or 0 where the kernel
 * cannot tell.  Used for the leader (kill.c) and the supervisor (sup.c).
 */
#if defined(__linux__)
#include <sys/ioctl.h>
struct bp_pidfd_info {          /* struct pidfd_info, its first version (64 bytes) */
    uint64_t mask;
    uint64_t cgroupid;
    uint32_t ids[11];           /* pid, tgid, ppid, then the credentials */
    int32_t exit_code;
};
#define BP_PIDFD_INFO_EXIT (1ULL << 3)
#define BP_PIDFD_GET_INFO _IOWR(0xFF, 11, struct bp_pidfd_info)
#endif

int bp__pidfd_exit_status(int pidfd, pid_t pid, int *status)
{
#if defined(__linux__)
    if (pidfd < 0)
        return 0;
    /* The kernel records the exit in the pidfd as it starts to release the task, a
     * moment after the pidfd turned readable and wait4 stopped seeing it, and before it
     * lets the pid go: ask again, briefly.  Once the pid names no task (kill(pid, 0) says
     * ESRCH), a kernel that records exits has this one, so the next answer is final:
     * Linux 6.13 and 6.14 have PIDFD_GET_INFO but no PIDFD_INFO_EXIT, and would say
     * ESRCH for the whole wait.  A pid reused meanwhile only brings back the wait. */
    int released = 0;
    for (int i = 0; i < 400; i++) {
        struct bp_pidfd_info info;
        memset(&info, 0, sizeof info);
        info.mask = BP_PIDFD_INFO_EXIT;
        if (ioctl(pidfd, BP_PIDFD_GET_INFO, &info) != 0) {
            if (errno != ESRCH)
                return 0;  /* ENOTTY, EINVAL: a kernel without PIDFD_GET_INFO */
        } else if (info.mask & BP_PIDFD_INFO_EXIT) {
            *status = info.exit_code;
            return 1;
        }
        if (released)
            return 0;  /* released, and no exit recorded: a kernel before 6.15 */
        released = kill(pid, 0) < 0 && errno == ESRCH;
        if (!released) {  /* not yet released: at most 0.1 s */
            struct timespec ts = {0, 250000};
            nanosleep(&ts, NULL);
        }
    }
    return 0;
#else
    (void)pidfd;
    (void)pid;
    (void)status;
    return 0;
#endif
}

/* A leader let go: reaped whenever it may be, by a thread of its own. */
static void *reap_later(void *p)
{
    pid_t pid = (pid_t)(intptr_t)p;
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return NULL;
}

/*
 * Uncontained: let the leader go, with the reason already in err_stage/errno:
 * counted unkilled (escaped), its status unknown (a kill's), and reaped by a
 * detached thread whenever that can be (it is our child: its pid stays ours
 * till then; without the thread, a zombie until this process exits).
 */
void bp__let_go(struct bp_run *run)
{
    struct bp_result *res = run->res;
    res->unkilled++;
    bp__record_unknown_status(res);
    pthread_t thread;
    (void)bp__quiet_thread(&thread, 64 * 1024, 1, reap_later, (void *)(intptr_t)run->pid);
    run->reaped = 1;  /* not ours to signal or wait for any more */
    bp__close_fd(&run->exit_fd);
}

/*
 * Uncontained, with a pidfd: whether the leader, once the pidfd says it
 * exited, is still not ours to wait for 100 ms later.  A traced zombie is
 * visible to its tracer alone until the tracer waits for it or exits, and a
 * child of the command that left its session and PTRACE_SEIZEd the leader
 * needs no privilege: a blocking wait4 waited for as long as that tracer
 * chose to live, past every bound and past a Ctrl-C.
 */
static int held_by_tracer(struct bp_run *run)
{
    struct pollfd p = {run->exit_fd, POLLIN, 0};
    int rc;
    do {
        rc = poll(&p, 1, -1);
    } while (rc < 0 && errno == EINTR);
    for (int i = 0; rc > 0; i++) {
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_PID, (id_t)run->pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0
                || info.si_pid != 0)
            return 0;  /* ours to wait for (or a failure the wait4 reports) */
        if (i == 10)
            return 1;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/*
 * Reap the leader (blocking) and record its status and resource use.
 * Returns 0, or -1 with errno set if wait4 failed for a reason other than
 * EINTR (then err_stage is BP_STAGE_WAIT).  Joins the exit watcher thread
 * first, so that it can never wait on a later child that reuses the pid.
 */
int bp__reap(struct bp_run *run)
{
    if (!bp__has_leader(run))
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
    do {  /* the usual case: it exited already, and this reaps it */
        r = wait4(run->pid, &status, WNOHANG, &ru);
    } while (r < 0 && errno == EINTR);
    if (r == 0) {  /* still dying, or held by a tracer */
        if (run->res->exit_watch == BP_WATCH_PIDFD && run->exit_fd >= 0 && held_by_tracer(run)) {
            if (run->res->err_stage == BP_STAGE_NONE) {
                run->res->err_stage = BP_STAGE_WAIT;
                run->res->err_errno = EBUSY;  /* runner failed: ... traced (_run.py) */
            }
            bp__let_go(run);
            return 0;
        }
        do {
            r = wait4(run->pid, &status, 0, &ru);
        } while (r < 0 && errno == EINTR);
    }
    int e = errno;  /* wait4's, whatever the pidfd is asked below */
    run->reaped = 1;
    struct bp_result *res = run->res;
    if (r < 0 && e == ECHILD && res->exit_watch == BP_WATCH_PIDFD
        && bp__pidfd_exit_status(run->exit_fd, run->pid, &status)) {
        /* Reaped by the kernel (the caller ignores SIGCHLD) or by a handler of the caller's
         * (waitpid(-1)): the status came from the pidfd; the resource use is lost. */
        r = run->pid;
        memset(&ru, 0, sizeof ru);
    }
    bp__close_fd(&run->exit_fd);
    bp__close_fd(&run->watch_pipe_w);
    if (r < 0) {
        bp__record_unknown_status(res);
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
        /* Killed for the cap: 137 and SIGKILL.  A leader that died of another
         * signal got there first (its own, racing the kill): that death is
         * reported as any the runner did not cause, 128 + N (bp__record_status). */
        if (res->term_signal == 0 || res->term_signal == SIGKILL) {
            res->exit_code = BP_OVERFLOW_EXIT_CODE;
            res->term_signal = SIGKILL;
        }
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
/* Whether /proc/NAME is a live (not zombie) member of pgid. */
static int live_member(const char *name, int pgid)
{
    char state = 0;
    int ppid = 0, pgrp = 0;
    if (bp__proc_stat(name, &state, &ppid, &pgrp, NULL) < 0)
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
