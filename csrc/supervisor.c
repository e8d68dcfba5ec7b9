/*
 * supervisor.c: the containment supervisor, a small program of its own.
 *
 * For a contained run the core execs this program (already in a new session,
 * with the run's stdio, cwd, limits and environment) instead of the command.
 * It makes itself a child subreaper, starts the command as the leader of a
 * session of its own, and then only waits: for the leader's exit, which it
 * reports without reaping, and for the core's commands (bp_supervisor.h).
 * Every process the run orphans is reparented here, so at the end it can kill
 * and reap each of them by pid: a descendant that called setsid, double
 * forked or daemonised does not outlive the run.  If the core's process dies,
 * even by SIGKILL, the command socket reads EOF and the supervisor kills
 * everything at once: no orphan outlives its grader.
 *
 * Linux only (PR_SET_CHILD_SUBREAPER, signalfd).
 */
#define _GNU_SOURCE 1

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "boundedproc.h"
#include "bp_child.h"
#include "bp_supervisor.h"

extern char **environ;

/* Give up killing after this long; what is left is reported as unkilled. */
#define KILL_BUDGET_NS 2000000000LL

static int st_fd = -1;

static void send_msg(const struct bp_sup_msg *m)
{
    const char *p = (const char *)m;
    size_t left = sizeof *m;
    while (left > 0) {
        ssize_t n = send(st_fd, p, left, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return;  /* the core is gone; carry on cleaning up */
        }
        p += n;
        left -= (size_t)n;
    }
}

static void send_simple(int type, int pid, int stage, int err)
{
    struct bp_sup_msg m;
    memset(&m, 0, sizeof m);
    m.type = type;
    m.pid = pid;
    m.stage = stage;
    m.err = err;
    send_msg(&m);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + (int64_t)ts.tv_nsec;
}

/* Our children other than `skip`, read from /proc (children of our only
 * thread), or by scanning every process's parent where that file is absent.
 * Returns the count stored in out[] (at most cap). */
static size_t list_children(pid_t self, pid_t skip, pid_t *out, size_t cap)
{
    char path[64];
    size_t n = 0;
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)self, (int)self);
    FILE *f = fopen(path, "re");
    if (f != NULL) {
        int pid;
        while (n < cap && fscanf(f, "%d", &pid) == 1)
            if (pid != skip)
                out[n++] = pid;
        fclose(f);
        return n;
    }
    /* Fallback (kernels without CONFIG_PROC_CHILDREN): scan every process. */
    DIR *d = opendir("/proc");
    if (d == NULL)
        return n;
    struct dirent *e;
    while (n < cap && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char buf[512], stat_path[300];
        snprintf(stat_path, sizeof stat_path, "/proc/%s/stat", e->d_name);
        int fd = open(stat_path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0)
            continue;
        buf[len] = '\0';
        char *rp = strrchr(buf, ')');
        char state;
        int ppid;
        if (rp != NULL && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == self) {
            int pid = atoi(e->d_name);
            if (pid != skip)
                out[n++] = pid;
        }
    }
    closedir(d);
    return n;
}

/* One round: signal the leader's group (while it is unreaped) and every
 * adopted child and its group; reap adopted children that have died.
 * Returns how many adopted children were still there. */
static size_t signal_round(pid_t self, pid_t leader, int leader_reaped, int sig)
{
    pid_t kids[4096];
    if (!leader_reaped)
        (void)kill(-leader, sig);
    size_t n = list_children(self, leader, kids, sizeof kids / sizeof kids[0]);
    for (size_t i = 0; i < n; i++) {
        /* Each is our unreaped child: its pid, and its group id when it leads
         * one, cannot be reused while we have not reaped it. */
        if (getpgid(kids[i]) == kids[i])
            (void)kill(-kids[i], sig);
        (void)kill(kids[i], sig);
    }
    for (size_t i = 0; i < n; i++)
        (void)waitpid(kids[i], NULL, WNOHANG);
    return n;
}

static void nap_ms(int ms)
{
    struct timespec ts = {0, (long)ms * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Kill everything, reap the leader, report, exit. */
__attribute__((noreturn)) static void finish(pid_t self, pid_t leader)
{
    struct bp_sup_msg m;
    memset(&m, 0, sizeof m);
    m.type = BP_MSG_FINAL;
    m.pid = leader;

    signal_round(self, leader, 0, SIGKILL);
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(leader, &status, 0, &ru) < 0 && errno == EINTR)
        ;
    m.status = status;
    m.utime_us = (int64_t)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec;
    m.stime_us = (int64_t)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec;
    m.maxrss_kb = (int64_t)ru.ru_maxrss;

    /* Orphans keep arriving while their parents die: repeat until none is
     * left or the budget is spent. */
    int64_t until = now_ns() + KILL_BUDGET_NS;
    size_t left = 0;
    for (int round = 0;; round++) {
        left = signal_round(self, leader, 1, SIGKILL);
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        if (left == 0 || now_ns() > until)
            break;
        nap_ms(round < 10 ? 1 : 10);
    }
    m.unkilled = (int32_t)left;
    send_msg(&m);
    _exit(0);
}

int main(int argc, char **argv)
{
    /* argv: SUP CTL_FD ST_FD NCAND CAND... -- ARGV... */
    if (argc < 6)
        return 2;
    int ctl = atoi(argv[1]);
    st_fd = atoi(argv[2]);
    int ncand = atoi(argv[3]);
    if (ncand < 0 || 4 + ncand >= argc || strcmp(argv[4 + ncand], "--") != 0)
        return 2;
    char **cands = malloc(((size_t)ncand + 1) * sizeof *cands);
    if (cands == NULL) {
        send_simple(BP_MSG_SPAWN_FAILED, 0, BP_STAGE_ALLOC, ENOMEM);
        return 1;
    }
    for (int i = 0; i < ncand; i++)
        cands[i] = argv[4 + i];
    cands[ncand] = NULL;
    char **cmd = argv + 5 + ncand;
    (void)fcntl(ctl, F_SETFD, FD_CLOEXEC);
    (void)fcntl(st_fd, F_SETFD, FD_CLOEXEC);

    /* The core blocked every signal before vfork; keep SIGCHLD blocked for
     * the signalfd and ignore the ones a terminal or a group kill might send
     * us, so that only our own command ends us. */
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0 || prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) {
        send_simple(BP_MSG_SPAWN_FAILED, 0, sfd < 0 ? BP_STAGE_SUPERVISOR : BP_STAGE_PRCTL, errno);
        return 1;
    }

    int ep[2];
    if (pipe2(ep, O_CLOEXEC) < 0) {
        send_simple(BP_MSG_SPAWN_FAILED, 0, BP_STAGE_PIPE, errno);
        return 1;
    }
    pid_t self = getpid();
    pid_t leader = vfork();
    if (leader == 0) {
        bp_child_default_signals();
        if (setsid() < 0) {
            int e[2] = {BP_STAGE_SETSID, errno};
            (void)!write(ep[1], e, sizeof e);
            _exit(127);
        }
        int keep[1] = {ep[1]};
        bp_child_close_fds(keep, 1);
        sigset_t none;
        sigemptyset(&none);
        (void)sigprocmask(SIG_SETMASK, &none, NULL);
        int e[2] = {BP_STAGE_EXEC, bp_child_exec(cands, cmd, environ)};
        (void)!write(ep[1], e, sizeof e);
        _exit(127);
    }
    int vfork_errno = errno;
    close(ep[1]);

    /* From here on, ignore what a terminal or a stray group signal sends. */
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    int ignored[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU,
                     SIGUSR1, SIGUSR2, SIGALRM};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        (void)sigaction(ignored[i], &ign, NULL);
    sigprocmask(SIG_SETMASK, &chld, NULL);

    if (leader < 0) {
        send_simple(BP_MSG_SPAWN_FAILED, 0, BP_STAGE_FORK, vfork_errno);
        return 1;
    }
    int e[2];
    ssize_t n;
    do {
        n = read(ep[0], e, sizeof e);
    } while (n < 0 && errno == EINTR);
    close(ep[0]);
    if (n != 0) {
        while (waitpid(leader, NULL, 0) < 0 && errno == EINTR)
            ;
        send_simple(BP_MSG_SPAWN_FAILED, 0, n == (ssize_t)sizeof e ? e[0] : BP_STAGE_EXEC,
                    n == (ssize_t)sizeof e ? e[1] : EIO);
        return 0;
    }

    /* Hold none of the run's pipes: their EOF must mean the run let go. */
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull >= 0) {
        dup2(devnull, 0);
        dup2(devnull, 1);
        dup2(devnull, 2);
        if (devnull > 2)
            close(devnull);
    }
    send_simple(BP_MSG_SPAWNED, leader, 0, 0);

    int exited = 0;
    for (;;) {
        struct pollfd fds[2] = {{ctl, POLLIN, 0}, {sfd, POLLIN, 0}};
        int rc = poll(fds, 2, -1);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            finish(self, leader);
        }
        if (fds[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0)
                ;
            if (!exited) {
                siginfo_t info;
                memset(&info, 0, sizeof info);
                if (waitid(P_PID, (id_t)leader, &info, WEXITED | WNOHANG | WNOWAIT) == 0
                    && info.si_pid == leader) {
                    exited = 1;
                    send_simple(BP_MSG_EXITED, leader, 0, 0);
                }
            }
        }
        if (fds[0].revents) {
            char c;
            ssize_t r = recv(ctl, &c, 1, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0 || c == 'K')
                finish(self, leader);
            if (c == 'T')
                signal_round(self, leader, 0, SIGTERM);
        }
    }
}
