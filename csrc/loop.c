/*
 * loop.c: the run handle and its poll loop.
 *
 * One thread, one poll(): the stdout and stderr pipes, the stdin pipe while a
 * payload remains, the cancel fd, the caller's wake fd, and the leader's exit
 * (a pidfd, or the pipe of a watcher thread where the kernel has no pidfd).
 * poll() sleeps until one of them is ready or the next deadline of the
 * current phase passes; nothing is polled on a timer while the run is
 * healthy, and no SIGCHLD handler is installed.
 */
#include "bp_internal.h"
#include "bp_supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/mman.h>
#include <sys/syscall.h>
#endif

int64_t bp__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + (int64_t)ts.tv_nsec;
}

void bp__close_fd(int *fd)
{
    if (*fd >= 0) {
        int saved = errno;
        close(*fd);
        errno = saved;
        *fd = -1;
    }
}

const char *bp_version(void)
{
    return BP_VERSION;
}

#if defined(__linux__) && defined(SYS_pidfd_open)
static int pidfd_open_(pid_t pid)
{
    return (int)syscall(SYS_pidfd_open, pid, 0);
}
#endif

/* ---- ending the run ---------------------------------------------------- */

static void close_stdin(struct bp_run *run)
{
    if (!run->stdin_fork_hidden) {
        bp__close_fd(&run->stdin_fd);
        return;
    }
    bp__fork_guard();  /* off the list and closed with no fork in between (spawn.c) */
    bp__fork_unhide(run->stdin_fd);
    bp__close_fd(&run->stdin_fd);
    run->stdin_fork_hidden = 0;
    bp__fork_unguard();
}

static void enter_drain(struct bp_run *run)
{
    run->phase = BP_PHASE_DRAIN;
    int64_t g = run->spec->drain_grace_ns;
    int64_t now = bp__now_ns();
    run->drain_end_ns = now + (g > 0 ? g : 0);
    /* The few ms a killed writer gets to close its ends (drain_deadline) count from
     * the kill, here: a drain_grace past them has given them already, and at the
     * bound's 5 ms floor below they are not waited for twice. */
    run->drain_settle_ns = now + BP_DRAIN_SETTLE_NS;
    /* A long final kill (a fork bomb) ate into the drain: the run's bound
     * (SPEC 2.2 step 7) still holds, with a few ms to read what is buffered. */
    if (run->bound_end_ns >= 0 && run->drain_end_ns > run->bound_end_ns)
        run->drain_end_ns = run->bound_end_ns > now + 5000000 ? run->bound_end_ns : now + 5000000;
}

/* Whether no process holds a write end of the output pipes still open here:
 * a pipe with no writer polls POLLHUP (after its buffered bytes, if any). */
static int writers_gone(const struct bp_run *run)
{
    struct pollfd p[2];
    nfds_t n = 0;
    if (run->out.fd >= 0)
        p[n++] = (struct pollfd){run->out.fd, 0, 0};
    if (run->err.fd >= 0)
        p[n++] = (struct pollfd){run->err.fd, 0, 0};
    if (poll(p, n, 0) < 0)
        return 0;
    for (nfds_t i = 0; i < n; i++)
        if (!(p[i].revents & (POLLHUP | POLLERR)))
            return 0;
    return 1;
}

#ifdef __linux__
static int compare_longs(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* Whether fd `name` of process pid is open for writing (/proc/PID/fdinfo's flags): a
 * pipe's read end held elsewhere (a child the caller forked has copies of our fds) writes
 * nothing and keeps no EOF away.  1 when it cannot be read: counted as a writer. */
static int opened_for_writing(long pid, const char *name)
{
    char path[64], buf[256];
    (void)snprintf(path, sizeof path, "/proc/%ld/fdinfo/%.16s", pid, name);
    if (bp__read_small(path, buf, sizeof buf) < 0)
        return 1;
    const char *at = strstr(buf, "flags:");
    unsigned flags = 0;
    if (at == NULL || sscanf(at + 6, " %o", &flags) != 1)
        return 1;
    return (flags & O_ACCMODE) != O_RDONLY;
}

/* The pids in /proc, in ascending order (*n of them; NULL: it cannot be read). */
static long *proc_pids(size_t *n)
{
    DIR *procs = opendir("/proc");
    if (procs == NULL)
        return NULL;
    size_t cap = 1024, got = 0;
    long *pids = malloc(cap * sizeof *pids);
    struct dirent *p;
    while (pids != NULL && (p = readdir(procs)) != NULL) {
        char *end;
        long pid = strtol(p->d_name, &end, 10);
        if (*end != '\0' || pid <= 0)
            continue;
        if (got == cap) {
            long *more = realloc(pids, 2 * cap * sizeof *pids);
            if (more == NULL) {
                free(pids);
                pids = NULL;
                break;
            }
            pids = more;
            cap *= 2;
        }
        pids[got++] = pid;
    }
    closedir(procs);
    if (pids != NULL)
        qsort(pids, got, sizeof *pids, compare_longs);
    *n = got;
    return pids;
}

/* A process other than this one that has an output pipe of the run open for writing
 * (readlink of its fds names the pipe's inode): its pid, or 0 when none is seen (-1: this
 * cannot be looked at).  One pass over /proc for both pipes.  fd directories this process
 * may not read (another user's processes, a setuid program's) are passed over, and
 * *partial is then set. */
static long pipe_holder(const struct bp_run *run, int *partial)
{
    char want[2][48], link[48], path[40];
    int wl[2] = {-1, -1};
    const int fds_of_run[2] = {run->out.fd, run->err.fd};
    for (int i = 0; i < 2; i++) {
        struct stat st;
        if (fds_of_run[i] < 0)
            continue;
        if (fstat(fds_of_run[i], &st) < 0)
            return -1;
        wl[i] = snprintf(want[i], sizeof want[i], "pipe:[%llu]", (unsigned long long)st.st_ino);
    }
    size_t count = 0;
    long *pids = proc_pids(&count);
    if (pids == NULL)
        return -1;
    long self = (long)getpid();
    long holder = 0;
    /* Newest first: a run's escapee came after its leader, and the look stops at the
     * first holder, so the host's older processes (thousands of fd tables, hundreds of
     * ms under load) are read only when no newer one holds the pipes. */
    for (size_t k = count; holder == 0 && k-- > 0;) {
        long pid = pids[k];
        if (pid == self)
            continue;
        (void)snprintf(path, sizeof path, "/proc/%ld/fd", pid);
        int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
            if (errno == EACCES || errno == EPERM)
                *partial = 1;
            continue;
        }
        DIR *fds = fdopendir(dfd);
        if (fds == NULL) {
            close(dfd);
            continue;
        }
        struct dirent *f;
        while (holder == 0 && (f = readdir(fds)) != NULL) {
            ssize_t n = readlinkat(dfd, f->d_name, link, sizeof link);
            for (int i = 0; i < 2 && n > 0; i++)  /* wl[i] is -1 for a pipe already closed */
                if (n == wl[i] && memcmp(link, want[i], (size_t)n) == 0
                        && opened_for_writing(pid, f->d_name))
                    holder = pid;
        }
        closedir(fds);
    }
    free(pids);
    return holder;
}

/* Whether pid, a child of ours, is not the run's: one in our own session (a fork of
 * this process), or one on our memory, a vfork child (another run's leader, or a
 * supervisor, between its clone and its exec, which holds copies of our fds for that
 * moment; it may have left our session already).  Any other child is an orphan we
 * adopted (as PID 1 or a subreaper) from a run, whose session it is in: an escapee, not
 * to be waited for.  1 when it cannot be told (kcmp missing or refused): waited for,
 * within the cap. */
static int ours_not_the_runs(long pid)
{
    pid_t sid = getsid((pid_t)pid);
    if (sid >= 0 && sid == getsid(0))
        return 1;
#ifdef SYS_kcmp
    long r = syscall(SYS_kcmp, (pid_t)getpid(), (pid_t)pid, 1 /* KCMP_VM */, 0UL, 0UL);
    if (r >= 0)
        return r == 0;
#endif
    return 1;
}

/* After a let-go (sup.c): whether the process whose parent is ppid descends from the
 * leader, still in its exit under its supervisor, which kills the leader's descendants
 * once its death hands them over.  At most 16 generations are walked. */
static int descends_from_dying_leader(const struct bp_run *run, int ppid)
{
    char name[24], state = 0;
    int up = 0, pgrp = 0;
    for (int i = 0; i < 16 && ppid > 1 && ppid != (int)run->pid; i++) {
        (void)snprintf(name, sizeof name, "%d", ppid);
        if (bp__proc_stat(name, &state, &up, &pgrp, NULL) < 0)
            return 0;
        ppid = up;
    }
    return ppid == (int)run->pid && bp__proc_exiting_child(run->pid, run->sup_pid);
}

/* Whether pid is one the run's end killed, on its way out: a member of the run's own
 * process group (SIGKILLed with it), or, contained, its supervisor or a child of it (an
 * orphan it adopted and kills), or any process already dying (one the supervisor killed
 * and left to finish its exit, slow when it frees much memory).  Or a child of this
 * process that is not the run's (ours_not_the_runs).  Read from /proc; 0 when it cannot
 * be read. */
static int killed_with_run(const struct bp_run *run, long pid)
{
    char name[24], state = 0;
    int ppid = 0, pgrp = 0;
    unsigned flags = 0;
    (void)snprintf(name, sizeof name, "%ld", pid);
    if (bp__proc_stat(name, &state, &ppid, &pgrp, &flags) < 0)
        return 0;
    if (run->spec->new_session && run->pid > 0 && pgrp == (int)run->pid)
        return 1;
    /* the supervisor closing its copies of the pipes, or an orphan it kills */
    if (run->sup_pid > 0 && (pid == run->sup_pid || ppid == run->sup_pid))
        return 1;
    if (run->sup_let_go && descends_from_dying_leader(run, ppid))
        return 1;
    return (ppid == (int)getpid() && ours_not_the_runs(pid)) || bp__proc_dying(name, state, flags);
}

/* Whether a process of the run's group, all SIGKILLed, is still there (the leader a
 * let-go supervisor has yet to reap, a member in its exit).  A process releases its
 * files at the end of its exit, the last reference of each deferred behind the rest (a
 * big memfd's pages first): a pipe no fd table holds may be one of its files on the way.
 * The group id is not reused while a member, zombie or not, is in it. */
static int group_left(const struct bp_run *run)
{
    return run->spec->new_session && run->pid > 0 && kill(-run->pid, 0) == 0;
}
#endif

/*
 * Past drain_grace and the settle, with a pipe still held: whether to wait on (the time
 * of the next look) or to call the holder an escapee (0).  See drain_deadline.
 */
static int64_t release_wait(struct bp_run *run, int64_t now)
{
#ifdef __linux__
    if (run->drain_cap_ns == 0)
        run->drain_cap_ns = now + (run->sup_let_go ? BP_DRAIN_LET_GO_NS : BP_DRAIN_RELEASE_NS);
    if (run->drain_unheld)  /* none was seen: the pipes' EOF ends the wait, by the cap */
        return now < run->drain_cap_ns ? run->drain_cap_ns : 0;
    int partial = 0;
    long holder = pipe_holder(run, &partial);
    if (holder == 0) {
        /* Where some fd tables could not be read, an unseen holder gets less, unless
         * a killed process of the run may still be releasing its files. */
        int short_wait = partial && !group_left(run);
        int64_t until = now + (short_wait ? BP_DRAIN_PARTIAL_NS : BP_DRAIN_RELEASE_NS);
        if (until < run->drain_cap_ns)
            run->drain_cap_ns = until;
        run->drain_unheld = 1;
        return run->drain_cap_ns;
    }
    if (holder > 0 && now < run->drain_cap_ns && killed_with_run(run, holder)) {
        run->drain_step_ns = run->drain_step_ns ? run->drain_step_ns * 2 : BP_DRAIN_SETTLE_NS;
        int64_t next = now + run->drain_step_ns;
        return next < run->drain_cap_ns ? next : run->drain_cap_ns;
    }
    return 0;
#else
    (void)run;
    (void)now;
    return 0;
#endif
}

/*
 * The drain's next deadline (-1: none), or 0 when it ends with an escapee
 * (SPEC 2.3: a process outside the group still held the pipes at
 * drain_grace).  At drain_grace the pipes are asked whether any writer is
 * left, not only whether they reached EOF: the bytes still buffered (a slow
 * on_output, a drain_grace of 0) are then read to EOF, never lost and never
 * taken for an escapee.  A writer may be one of the group just killed, on its
 * way out (or the supervisor about to close its copies): it gets a few ms from
 * the kill (enter_drain), which a drain_grace past them has given already.
 * Then the fd tables are looked at (release_wait).  A process killed with the
 * run can be a zombie already while the kernel has not yet released its files
 * (it defers that by a clock tick, and by tens of ms on a loaded machine): a
 * pipe no process holds is waited on until its EOF, for at most
 * BP_DRAIN_RELEASE_NS (only BP_DRAIN_PARTIAL_NS where some fd tables could not
 * be read).  A holder the run's end killed, or one on its way out, or a child of
 * this process (killed_with_run) is looked at again, at growing steps, within
 * the same cap.  Any other holder is an escapee, at once.
 */
static int64_t drain_deadline(struct bp_run *run, int64_t now)
{
    if (run->drain_to_eof)
        return -1;
    if (now < run->drain_end_ns)
        return run->drain_end_ns;
    if (writers_gone(run)) {
        run->drain_to_eof = 1;  /* finite: at most what the pipes hold */
        return -1;
    }
    if (now < run->drain_settle_ns)
        return run->drain_settle_ns;
    run->drain_settle_ns = release_wait(run, now);  /* 0 ends the drain: never read again */
    return run->drain_settle_ns;
}

/*
 * Uncontained, after the group's SIGKILL: whether the leader may not be
 * signalled by us (EPERM: it runs as another user, as a setuid program that
 * took root for good, or a command under sudo, started by a caller that is
 * not root) and is still running 100 ms later.  A blocking reap would wait for
 * as long as it chooses to run, past every bound of the run.  Such a leader is
 * let go: the run reports EPERM at BP_STAGE_KILL (runner failed: ...), counts
 * it unkilled (escaped) and its status as a kill's, and a detached thread
 * reaps it whenever it exits (it is our child: its pid stays ours till then).
 * Where the exit is not watched with a pidfd (before Linux 5.3), the reap
 * still waits.  Contained, the supervisor does the same (supervisor.c).
 */
static int let_go_unkillable(struct bp_run *run)
{
    if (run->sup != NULL || run->pid <= 0 || run->reaped || run->leader_exited
        || run->res->exit_watch != BP_WATCH_PIDFD || run->exit_fd < 0
        || kill(run->pid, 0) == 0 || errno != EPERM)
        return 0;
    struct pollfd p = {run->exit_fd, POLLIN, 0};
    int rc;
    do {
        rc = poll(&p, 1, 100);
    } while (rc < 0 && errno == EINTR);
    if (rc != 0)
        return 0;  /* it exited after all: reaped as usual */
    struct bp_result *res = run->res;
    if (res->err_stage == BP_STAGE_NONE) {
        res->err_stage = BP_STAGE_KILL;
        res->err_errno = EPERM;
    }
    bp__let_go(run);
    return 1;
}

/* SIGKILL the group, reap the leader, start draining. */
static int kill_and_reap(struct bp_run *run)
{
    bp__signal_group(run, SIGKILL);
    int rc = let_go_unkillable(run) ? 0 : bp__reap(run);
    enter_drain(run);
    return rc;
}

/* Decide why the run ends and start ending it. */
static int end_run(struct bp_run *run, int reason)
{
    if (run->res->end_reason == BP_END_NONE)
        run->res->end_reason = reason;
    close_stdin(run);
    int64_t grace = run->spec->kill_grace_ns;
    if (reason == BP_END_OVERFLOW || grace == 0)
        return kill_and_reap(run);
    int first = run->spec->first_signal > 0 ? run->spec->first_signal : SIGTERM;
    bp__signal_group(run, first);
    if (first != SIGCONT)
        bp__signal_group(run, SIGCONT);  /* a stopped command acts on it only once continued */
    run->phase = BP_PHASE_GRACE;
    int64_t now = bp__now_ns();
    run->grace_end_ns = grace < 0 ? -1 : now + grace;
    run->group_check_step_ns = 1000000;  /* 1 ms, doubling to 50 ms */
    run->next_group_check_ns = now;
    return 0;
}

/*
 * bp_signal: send sig to the run's group (to the leader alone when
 * spec->new_session is 0), for a caller that forwards signals it received.
 * Returns 0, or -1 with errno ESRCH once the leader is reaped (nothing can
 * be signalled safely then).
 */
int bp_signal(struct bp_run *run, int sig)
{
    if (run == NULL || !bp__has_leader(run) || run->phase == BP_PHASE_DONE) {
        errno = ESRCH;
        return -1;
    }
    bp__signal_group(run, sig);
    return 0;
}

/* bp_run_pid: the run's leader, once known; 0 before (a contained leader writes
 * its pid into the page it shares with the supervisor just before its exec). */
int bp_run_pid(struct bp_run *run)
{
    if (run == NULL)
        return 0;
    if (run->pid <= 0 && run->sup != NULL)
        return (int)bp__sup_page_pid(run);
    return run->pid > 0 ? (int)run->pid : 0;
}

/* How long finish() waits for the group's killed processes to be dead. */
#define BP_DYING_CAP_NS 250000000LL
/* How long only kill(-pgid, 0) is asked, before /proc is read. */
#define BP_DYING_QUICK_NS 2000000LL

/*
 * The run's group was SIGKILLed and its leader reaped, but a member can still
 * be running its exit (its files closed, so its pipes' EOF came, and not yet
 * a zombie: 2% of 40 background sleepers, uncontained).  "No process of the
 * group outlives the call" (SPEC 2.2): wait until none is running, for at
 * most BP_DYING_CAP_NS.  One kill(-pgid, 0) when the group is gone (the usual
 * case, and always when contained: the supervisor reaped them all).  While
 * some member, zombie or not, is there, kill(-pgid, 0) is asked again for a
 * few ms (the members' orphans are zombies until init reaps them, which it
 * does at once), and only then is /proc looked at (tens of ms on a host with
 * thousands of processes), for a member that is not a zombie.
 */
static void wait_group_dead(struct bp_run *run)
{
    /* (a let-go supervisor's leader is in its exit: the supervisor reaps it) */
    if (!run->spec->new_session || run->pid <= 0 || !run->reaped || run->sup_let_go)
        return;
    int64_t began = bp__now_ns();
    long step_ns = 100000;
    for (;;) {
        /* Members that are our children now (a caller that is a subreaper, or PID 1
         * of its namespace, adopts the run's orphans): reaped, or they would stay
         * zombies for the caller's life.  A group id is not reused while a member,
         * zombie or not, is in it, so these are the run's. */
        while (waitpid(-run->pid, NULL, WNOHANG) > 0)
            ;
        if (kill(-run->pid, 0) < 0)
            return;                     /* no member left, zombie or not */
        int64_t now = bp__now_ns();
        if (now - began >= BP_DYING_CAP_NS)
            return;
        if (now - began >= BP_DYING_QUICK_NS && !bp_group_alive((int)run->pid))
            return;                     /* zombies only */
        struct timespec ts = {0, step_ns};
        (void)nanosleep(&ts, NULL);
        if (step_ns < 5000000)
            step_ns *= 2;
    }
}

static void finish(struct bp_run *run)
{
    wait_group_dead(run);
    bp__close_fd(&run->out.fd);
    bp__close_fd(&run->err.fd);
    close_stdin(run);
    if (run->sup != NULL)
        run->exit_fd = -1;  /* the supervisor's socket: borrowed, not ours to close */
    else
        bp__close_fd(&run->exit_fd);
    bp__close_fd(&run->watch_pipe_w);
    bp__close_fd(&run->ctl_fd);
    bp__finish_result(run);
    run->phase = BP_PHASE_DONE;
}

/* ---- I/O ---------------------------------------------------------------- */

/*
 * write(2) to a pipe whose reader left raises SIGPIPE in the writing thread,
 * and a caller may have SIGPIPE at its default (a CLI that restores it): the
 * write is made with SIGPIPE blocked in this thread, and a SIGPIPE it raised
 * (one that was not pending before) is taken back before the mask returns, so
 * the caller sees neither a death nor a stray signal; EPIPE remains.
 */
static ssize_t write_nosigpipe(int fd, const void *buf, size_t len)
{
    sigset_t pipe_only, old, pending;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    sigemptyset(&pending);
    (void)sigpending(&pending);
    int was_pending = sigismember(&pending, SIGPIPE) == 1;
    (void)pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
    ssize_t n = write(fd, buf, len);
    int err = errno;
    if (n < 0 && err == EPIPE && !was_pending) {
        static const struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_only, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = err;
    return n;
}

static void write_stdin(struct bp_run *run)
{
    const struct bp_spec *spec = run->spec;
    while (run->stdin_fd >= 0 && run->stdin_off < spec->stdin_len) {
        size_t left = spec->stdin_len - run->stdin_off;
        ssize_t n = write_nosigpipe(run->stdin_fd, spec->stdin_data + run->stdin_off, left);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            /* EPIPE: the child closed its stdin; the rest is not delivered. */
            close_stdin(run);
            return;
        }
        run->stdin_off += (size_t)n;
        run->res->stdin_written = run->stdin_off;
    }
    if (run->stdin_off >= spec->stdin_len) {
        run->res->stdin_delivered = 1;
        close_stdin(run);
    }
}

/* ---- the exit watcher thread, for kernels without pidfd ----------------- */

static void *watcher_main(void *p)
{
    struct bp_run *run = p;
    siginfo_t info;
    sigset_t all;
    sigfillset(&all);
    (void)pthread_sigmask(SIG_BLOCK, &all, NULL);  /* no signal of the caller's lands here */
    /* WNOWAIT: learn of the exit without reaping, so the leader stays a
     * zombie and the group id stays ours until bp__reap(). */
    while (waitid(P_PID, (id_t)run->pid, &info, WEXITED | WNOWAIT) < 0 && errno == EINTR)
        ;
    ssize_t n;
    do {
        n = write(run->watch_pipe_w, "x", 1);
    } while (n < 0 && errno == EINTR);
    return NULL;
}

static int start_exit_watch(struct bp_run *run)
{
    int mode = run->spec->exit_watch;
    if (run->sup != NULL) {
        run->res->exit_watch = BP_WATCH_SUPERVISOR;  /* its socket is exit_fd */
        return 0;
    }
    if (run->spawn_pidfd >= 0 && (mode == BP_WATCH_AUTO || mode == BP_WATCH_PIDFD)) {
        run->exit_fd = run->spawn_pidfd;  /* made with the child: see spawn.c */
        run->spawn_pidfd = -1;
        run->res->exit_watch = BP_WATCH_PIDFD;
        return 0;
    }
    bp__close_fd(&run->spawn_pidfd);
#if defined(__linux__) && defined(SYS_pidfd_open)
    if (mode == BP_WATCH_AUTO || mode == BP_WATCH_PIDFD) {
        int fd = pidfd_open_(run->pid);
        if (fd >= 0) {
            run->exit_fd = fd;
            run->res->exit_watch = BP_WATCH_PIDFD;
            return 0;
        }
        if (mode == BP_WATCH_PIDFD) {
            run->res->err_stage = BP_STAGE_PIDFD;
            run->res->err_errno = errno;
            return -1;
        }
    }
#endif
    int p[2];
    if (pipe(p) < 0) {
        run->res->err_stage = BP_STAGE_PIPE;
        run->res->err_errno = errno;
        return -1;
    }
    (void)fcntl(p[0], F_SETFD, FD_CLOEXEC);
    (void)fcntl(p[1], F_SETFD, FD_CLOEXEC);
    run->exit_fd = p[0];
    run->watch_pipe_w = p[1];
    int rc = bp__quiet_thread(&run->watcher, 0, 0, watcher_main, run);  /* takes no signals */
    if (rc != 0) {
        run->res->err_stage = BP_STAGE_THREAD;
        run->res->err_errno = rc;
        return -1;
    }
    run->watcher_started = 1;
    run->res->exit_watch = BP_WATCH_THREAD;
    return 0;
}

/* The exit fd is readable: a pidfd (the leader exited), the watcher's pipe,
 * or the supervisor's status socket (BP_MSG_EXITED, or EOF if it died). */
static void note_exit_event(struct bp_run *run)
{
    if (run->sup == NULL) {
        run->leader_exited = 1;
        run->exit_ns = run->alive_seen_ns;  /* nobody saw when: it was alive then */
        return;
    }
    bp__sup_event(run);
    if (!run->res->spawned)
        finish(run);  /* the contained start failed: nothing ran (sup.c) */
}

/* The deadline has passed with no exit seen: take an exit event that is
 * waiting on the exit fd (the caller was away when it came), without waiting
 * for one.  Returns 1 when that ended the run (a contained start that failed). */
static int look_for_exit(struct bp_run *run)
{
    /* Contained, a start report may come first (no shared page): a few records. */
    for (int i = 0; i < 4 && !run->leader_exited && run->exit_fd >= 0; i++) {
        struct pollfd p = {run->exit_fd, POLLIN, 0};
        if (poll(&p, 1, 0) != 1)
            break;
        note_exit_event(run);
        if (run->phase == BP_PHASE_DONE)
            return 1;
    }
    return 0;
}

/* ---- public entry points ------------------------------------------------ */

/*
 * bp_start: spawn spec's command and return its handle in *out.
 * Returns 0 with *out set, also when the OS refused the spawn (then
 * res->spawned == 0, res->err_stage/err_errno say why, res->exit_code is 126
 * or 127, and the handle is already done).  Returns -1 with errno ENOMEM and
 * *out NULL only when the handle itself cannot be allocated.  res is zeroed
 * first and written by every later call on the handle; it and spec must stay
 * valid until bp_free().
 */
int bp_start(const struct bp_spec *spec, struct bp_result *res, struct bp_sup *sup,
             struct bp_run **out)
{
    *out = NULL;
    memset(res, 0, sizeof *res);
    struct bp_run *run = calloc(1, sizeof *run);
    if (run == NULL) {
        res->err_stage = BP_STAGE_ALLOC;
        res->err_errno = ENOMEM;
        errno = ENOMEM;
        return -1;
    }
    run->res = res;
    run->spec = spec;
    run->sup = sup;
    run->bound_end_ns = -1;
    run->exit_fd = run->watch_pipe_w = run->stdin_fd = run->ctl_fd = run->spawn_pidfd = -1;
    run->out.fd = run->err.fd = -1;
    run->deadline_ns = -1;
    run->exited_status = -1;
    res->stdin_delivered = spec->stdin_len == 0;
    res->raw_exit_code = -1;
    res->stdout_gap = res->stderr_gap = -1;
    *out = run;

    bp__fork_guard();  /* until the child's ends are closed: spawn.c, "The fork guard" */
    bp__spawn(run);
    if (!res->spawned) {
        bp__fork_unguard();
        run->phase = BP_PHASE_DONE;
        return 0;
    }
    run->start_ns = bp__now_ns();
    run->alive_seen_ns = run->start_ns;
    run->next_sup_check_ns = bp__now_ns() + BP_SUP_CHECK_NS;
    if (spec->timeout_ns >= 0) {
        run->deadline_ns = run->start_ns + spec->timeout_ns;
        if (spec->kill_grace_ns >= 0)
            run->bound_end_ns = run->deadline_ns + spec->kill_grace_ns + spec->drain_grace_ns;
    }
    if (run->stdin_off >= spec->stdin_len) {  /* none, or all of it in the pipe (bp__spawn) */
        res->stdin_delivered = 1;
        close_stdin(run);
    } else {
        run->stdin_fork_hidden = bp__fork_hide(run->stdin_fd);  /* the loop writes the rest */
    }
    bp__fork_unguard();

    if (start_exit_watch(run) < 0) {
        /* Started but unwatchable: end it at once rather than run blind. */
        int stage = res->err_stage, err = res->err_errno;
        res->end_reason = BP_END_ABORT;
        kill_and_reap(run);
        finish(run);
        res->err_stage = stage;
        res->err_errno = err;
        return 0;
    }
    return 0;
}

static int ms_until(int64_t now, int64_t when)
{
    if (when < 0)
        return -1;
    if (when <= now)
        return 0;
    int64_t ms = (when - now + 999999) / 1000000;
    return ms > 1000000000 ? 1000000000 : (int)ms;
}

/*
 * bp_wait: drive the run until it is over.
 * Returns BP_DONE once the leader is reaped, the pipes are drained (or
 * abandoned at drain_grace, setting res->escaped) and res is complete.
 * Returns BP_AGAIN when poll() was interrupted by a signal or the wake fd is
 * readable; the caller handles that and calls bp_wait() again.  With
 * spec->report_chunks, returns BP_CHUNK after each read that produced bytes
 * (the chunk is bp_chunk()'s until the next call); the caller takes it and
 * calls bp_wait() again.  Returns -1 with errno set and
 * res->err_stage/err_errno filled on an internal failure (poll error,
 * allocation failure); the run has then been killed and reaped.
 */
int bp_wait(struct bp_run *run)
{
    const struct bp_spec *spec = run->spec;
    struct bp_result *res = run->res;
    struct pollfd fds[7];
    enum { S_OUT, S_ERR, S_IN, S_EXIT, S_CANCEL, S_CANCEL2, S_WAKE, S_N };
    int idx[S_N];

    bp__chunk_release(run);  /* the caller is done with the last BP_CHUNK's bytes */
    for (;;) {
        if (bp__chunk_deliver(run))
            return BP_CHUNK;  /* before anything else, so no chunk is lost */
        if (run->phase == BP_PHASE_DONE)
            return BP_DONE;
        int64_t now = bp__now_ns();
        int64_t wake_at = -1;

        if (run->phase == BP_PHASE_RUNNING) {
            /* The first of the exit and the deadline ends the run (SPEC 2.2), by when
             * the exit happened, not by when the loop got to it: a caller held away
             * from it (a callback that blocks, a stopped process) comes back to both. */
            int late = run->deadline_ns >= 0 && now >= run->deadline_ns;
            if (late && !run->leader_exited && look_for_exit(run))
                continue;  /* a failed contained start: done */
            if (run->leader_exited && !(late && run->exit_ns >= run->deadline_ns)) {
                end_run(run, BP_END_EXIT);
                continue;
            }
            if (late) {
                end_run(run, BP_END_DEADLINE);
                continue;
            }
            wake_at = run->deadline_ns;
        } else if (run->phase == BP_PHASE_GRACE) {
            int empty = 0;
            if (run->leader_exited && (run->grace_end_ns < 0 || !run->spec->new_session)) {
                /* No grace bound (as timeout(1) without -k), or no group of
                 * its own: the leader's exit ends the grace. */
                empty = 1;
            } else if (run->leader_exited && now >= run->next_group_check_ns) {
                empty = !bp_group_alive((int)run->pid);
                run->next_group_check_ns = now + run->group_check_step_ns;
                if (run->group_check_step_ns < 50000000)
                    run->group_check_step_ns *= 2;
            }
            if (empty || (run->grace_end_ns >= 0 && now >= run->grace_end_ns)) {
                kill_and_reap(run);
                continue;
            }
            wake_at = run->grace_end_ns;
            if (run->leader_exited && (wake_at < 0 || run->next_group_check_ns < wake_at))
                wake_at = run->next_group_check_ns;
        } else {  /* DRAIN */
            if (run->out.fd < 0 && run->err.fd < 0) {
                finish(run);
                return BP_DONE;
            }
            wake_at = drain_deadline(run, now);
            if (wake_at == 0) {
                res->escaped = 1;
                finish(run);
                return BP_DONE;
            }
        }

        int n = 0;
        for (int i = 0; i < S_N; i++)
            idx[i] = -1;
#define ADD(slot, fdv, ev)                  \
    do {                                    \
        if ((fdv) >= 0) {                   \
            fds[n].fd = (fdv);              \
            fds[n].events = (ev);           \
            fds[n].revents = 0;             \
            idx[slot] = n++;                \
        }                                   \
    } while (0)
        ADD(S_OUT, run->out.fd, POLLIN);
        ADD(S_ERR, run->err.fd, POLLIN);
        if (run->phase == BP_PHASE_RUNNING)
            ADD(S_IN, run->stdin_fd, POLLOUT);
        if (!run->leader_exited && !run->reaped)
            ADD(S_EXIT, run->exit_fd, POLLIN);
        if (run->phase == BP_PHASE_RUNNING)
            ADD(S_CANCEL, spec->cancel_fd, POLLIN);
        if (run->phase == BP_PHASE_RUNNING || run->phase == BP_PHASE_DRAIN)
            ADD(S_CANCEL2, spec->cancel_fd2, POLLIN);
        ADD(S_WAKE, spec->wake_fd, POLLIN);
#undef ADD

        if (run->sup != NULL && !run->sup_dead && !run->reaped) {
            if (now >= run->next_sup_check_ns) {
                bp__sup_revive(run->sup);  /* a command may have stopped it */
                run->next_sup_check_ns = now + BP_SUP_CHECK_NS;
            }
            if (wake_at < 0 || run->next_sup_check_ns < wake_at)
                wake_at = run->next_sup_check_ns;
        }
        int rc = poll(fds, (nfds_t)n, ms_until(now, wake_at));
        if (rc < 0) {
            if (errno == EINTR)
                return BP_AGAIN;
            int e = errno;
            res->err_stage = BP_STAGE_POLL;
            res->err_errno = e;
            bp_abort(run);
            errno = e;
            return -1;
        }
        if (run->sup == NULL && idx[S_EXIT] >= 0 && fds[idx[S_EXIT]].revents == 0)
            run->alive_seen_ns = bp__now_ns();
        if (rc == 0)
            continue;

        if (bp__read_ready(run, idx[S_OUT] >= 0 && fds[idx[S_OUT]].revents != 0,
                           idx[S_ERR] >= 0 && fds[idx[S_ERR]].revents != 0) < 0)
            goto internal_error;
        if (spec->overflow_kill && res->output_truncated && run->phase == BP_PHASE_RUNNING) {
            end_run(run, BP_END_OVERFLOW);
            continue;
        }
        if (idx[S_IN] >= 0 && fds[idx[S_IN]].revents != 0)
            write_stdin(run);
        if (idx[S_EXIT] >= 0 && fds[idx[S_EXIT]].revents != 0)
            note_exit_event(run);
        int cancel_ready = (idx[S_CANCEL] >= 0 && fds[idx[S_CANCEL]].revents != 0)
                           || (idx[S_CANCEL2] >= 0 && fds[idx[S_CANCEL2]].revents != 0);
        if (cancel_ready && run->phase == BP_PHASE_RUNNING && !run->leader_exited) {
            end_run(run, BP_END_CANCEL);
            continue;
        }
        if (cancel_ready && run->phase == BP_PHASE_DRAIN) {
            /* The second switch's caller (an awaiting task cancelled, a run_many
             * closed early) takes no result: an escapee holding the pipes is not
             * waited for until drain_grace, as run()'s own Ctrl-C does not. */
            finish(run);
            return BP_DONE;
        }
        if (idx[S_WAKE] >= 0 && fds[idx[S_WAKE]].revents != 0)
            return BP_AGAIN;
    }

internal_error: {
        int e = errno;
        bp_abort(run);
        errno = e;
        return -1;
    }
}

/*
 * bp_abort: end the run now: SIGKILL the group (while the leader is
 * unreaped), reap the leader, close every fd.  Sets end_reason to
 * BP_END_ABORT if no other reason was decided.  Idempotent; never fails.
 */
void bp_abort(struct bp_run *run)
{
    if (run == NULL || run->phase == BP_PHASE_DONE)
        return;
    if (run->res->end_reason == BP_END_NONE)
        run->res->end_reason = BP_END_ABORT;
    bp__signal_group(run, SIGKILL);
    if (!let_go_unkillable(run))
        (void)bp__reap(run);
    finish(run);
}

/*
 * bp_free: release the handle and its buffers; aborts a run still going.
 * Accepts NULL.
 */
void bp_free(struct bp_run *run)
{
    if (run == NULL)
        return;
    bp_abort(run);
    bp__output_release(run);
    free(run);
}
