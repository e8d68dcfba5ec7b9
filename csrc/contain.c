/*
 * contain.c: the containment supervisor, run inside the caller's address
 * space.
 *
 * For a contained run the core does not exec a helper program: it clones a
 * supervisor process that shares the caller's memory (CLONE_VM, no
 * CLONE_VFORK, its own stack), so containing a run costs a clone and not an
 * exec.  The supervisor makes itself a child subreaper, starts the command as
 * the leader of a new session with clone(CLONE_VM|CLONE_VFORK) onto a second
 * stack, and then only waits: for the leader's exit, which it reports without
 * reaping, and for the core's commands (bp_supervisor.h).  Every process the
 * run orphans (setsid, double fork, daemonising) is reparented to it, so at
 * the end it kills and reaps each of them by pid.  If the caller's process
 * dies, even by SIGKILL, the command socket reads EOF and the supervisor
 * kills everything: no orphan outlives its grader.
 *
 * Because the caller's threads keep running meanwhile, the supervisor and the
 * leader (until its exec) use raw system calls only (bp_sys.h): no errno, no
 * allocation, no stdio, no signal handlers (every signal stays blocked in the
 * supervisor; the leader resets dispositions and its mask before exec).  The
 * supervisor touches no memory of the caller's after the leader has exec'd
 * except its own context block and stacks, which the core unmaps only after
 * reaping it.
 */
#include "bp_internal.h"
#include "bp_supervisor.h"
#include "bp_sys.h"

#if BP_HAVE_RAW_SYSCALLS

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

#define SUP_STACK ((size_t)256 * 1024)
#define LEADER_STACK ((size_t)64 * 1024)
#define CTX_SPACE ((size_t)4096)
#define KILL_BUDGET_NS 2000000000LL
#define MAX_KIDS 2048

/* The kernel's struct sigaction (no restorer needed for SIG_DFL). */
struct k_sigaction {
    void *handler;
    unsigned long flags;
    void *restorer;
    unsigned long mask;
};

struct rlimit64_ {
    uint64_t cur;
    uint64_t max;
};

struct linux_dirent64_ {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* Everything the supervisor and the leader need, placed by the core at the
 * start of the mapping that also holds their stacks. */
struct bp_contain_ctx {
    const struct bp_spec *spec;
    char *const *envp;
    int in_r;
    int out_w;
    int err_w;
    int ctl;
    int st;
    int lep_r;
    int lep_w;
    unsigned char *leader_stack_top;
};

/* ---- small raw helpers ---------------------------------------------------- */

BP_RAW_FN void r_close(long fd)
{
    if (fd >= 0)
        (void)bp_sys1(SYS_close, fd);
}

BP_RAW_FN long r_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        long n = bp_sys6(SYS_sendto, fd, (long)p, (long)len, MSG_NOSIGNAL, 0, 0);
        if (n == -ENOTSOCK)
            n = bp_sys3(SYS_write, fd, p, len);
        if (n == -EINTR)
            continue;
        if (n <= 0)
            return n;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

BP_RAW_FN void r_zero(void *p, size_t n)
{
    volatile unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        c[i] = 0;
}

BP_RAW_FN void send_msg(int st, int type, int pid, int stage, int err)
{
    struct bp_sup_msg m;
    r_zero(&m, sizeof m);
    m.type = type;
    m.pid = pid;
    m.stage = stage;
    m.err = err;
    (void)r_write_all(st, &m, sizeof m);
}

BP_RAW_FN int64_t r_now_ns(void)
{
    struct timespec ts;
    ts.tv_sec = 0;
    ts.tv_nsec = 0;
    (void)bp_sys2(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + (int64_t)ts.tv_nsec;
}

BP_RAW_FN void r_nap_ms(long ms)
{
    struct timespec ts;
    ts.tv_sec = 0;
    ts.tv_nsec = ms * 1000000L;
    (void)bp_sys4(SYS_ppoll, 0, 0, &ts, 0);
}

/* Close every fd but those in keep[] (which need not be sorted). */
BP_RAW_FN void r_close_except(const int *keep, int nkeep)
{
    unsigned lo = 0;
    for (;;) {
        unsigned next = ~0U;  /* the smallest kept fd >= lo */
        for (int i = 0; i < nkeep; i++)
            if (keep[i] >= 0 && (unsigned)keep[i] >= lo && (unsigned)keep[i] < next)
                next = (unsigned)keep[i];
        if (next > lo) {
            unsigned hi = next == ~0U ? ~0U : next - 1;
            if (bp_sys3(SYS_close_range, lo, hi, 0) < 0) {
                /* No close_range: close one by one up to the fd limit. */
                struct rlimit64_ rl;
                unsigned max = 1U << 16;
                if (bp_sys4(SYS_prlimit64, 0, RLIMIT_NOFILE, 0, &rl) == 0 && rl.cur < (1U << 20))
                    max = (unsigned)rl.cur;
                for (unsigned fd = lo; fd <= hi && fd < max; fd++)
                    (void)bp_sys1(SYS_close, fd);
            }
        }
        if (next == ~0U)
            return;
        lo = next + 1;
    }
}

/* ---- the leader, between clone and exec ----------------------------------- */

__attribute__((noreturn)) BP_RAW_FN void leader_fail(const struct bp_contain_ctx *c, int stage,
                                                     long neg_err)
{
    int e[2];
    e[0] = stage;
    e[1] = (int)-neg_err;
    (void)bp_sys3(SYS_write, c->lep_w, e, sizeof e);
    (void)bp_sys1(SYS_exit_group, BP_SPAWN_FAILURE_EXIT_CODE);
    __builtin_unreachable();
}

BP_RAW_FN int rlimit_of(int index)
{
    switch (index) {
    case BP_RLIMIT_CPU: return RLIMIT_CPU;
    case BP_RLIMIT_AS: return RLIMIT_AS;
    case BP_RLIMIT_NPROC: return RLIMIT_NPROC;
    case BP_RLIMIT_FSIZE: return RLIMIT_FSIZE;
    case BP_RLIMIT_NOFILE: return RLIMIT_NOFILE;
    default: return -1;
    }
}

BP_RAW_FN int leader_main(void *arg)
{
    const struct bp_contain_ctx *c = arg;
    const struct bp_spec *spec = c->spec;
    long rc;

    struct k_sigaction dfl;
    dfl.handler = SIG_DFL;
    dfl.flags = 0;
    dfl.restorer = 0;
    dfl.mask = 0;
    for (int sig = 1; sig <= 64; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            (void)bp_sys4(SYS_rt_sigaction, sig, &dfl, 0, 8);

    if (spec->new_session && (rc = bp_sys0(SYS_setsid)) < 0)
        leader_fail(c, BP_STAGE_SETSID, rc);
    int src[3] = {c->in_r, c->out_w, c->err_w};
    for (int fd = 0; fd < 3; fd++) {
        if (src[fd] < 0)
            r_close(fd);
        else if ((rc = bp_sys3(SYS_dup3, src[fd], fd, 0)) < 0)
            leader_fail(c, BP_STAGE_DUP, rc);
    }
    if (bp_sys3(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) < 0) {
        int keep[4] = {0, 1, 2, c->lep_w};  /* the error pipe is close-on-exec */
        r_close_except(keep, 4);
    }
    for (int i = 0; i < BP_NRLIMITS; i++) {
        if (spec->rlimits_soft[i] < 0 && spec->rlimits_hard[i] < 0)
            continue;
        int resource = rlimit_of(i);
        struct rlimit64_ rl;
        if (resource < 0)
            leader_fail(c, BP_STAGE_RLIMIT, -EINVAL);
        if ((rc = bp_sys4(SYS_prlimit64, 0, resource, 0, &rl)) < 0)
            leader_fail(c, BP_STAGE_RLIMIT, rc);
        if (spec->rlimits_soft[i] >= 0)
            rl.cur = (uint64_t)spec->rlimits_soft[i];
        if (spec->rlimits_hard[i] >= 0)
            rl.max = (uint64_t)spec->rlimits_hard[i];
        if ((rc = bp_sys4(SYS_prlimit64, 0, resource, &rl, 0)) < 0)
            leader_fail(c, BP_STAGE_RLIMIT, rc);
    }
    if (spec->cwd != NULL && (rc = bp_sys1(SYS_chdir, spec->cwd)) < 0)
        leader_fail(c, BP_STAGE_CHDIR, rc);

    unsigned long none = 0;
    (void)bp_sys4(SYS_rt_sigprocmask, SIG_SETMASK, &none, 0, 8);

    /* As execvp, except that ENOEXEC is reported, never retried with sh. */
    int saw_eacces = 0;
    long last = -ENOENT;
    for (char *const *p = spec->exec_paths; *p != NULL; p++) {
        rc = bp_sys3(SYS_execve, *p, spec->argv, c->envp);
        if (rc == -EACCES) {
            saw_eacces = 1;
            last = rc;
        } else if (rc == -ENOENT || rc == -ENOTDIR || rc == -ELOOP || rc == -ENAMETOOLONG
                   || rc == -ESTALE || rc == -ENODEV || rc == -ETIMEDOUT) {
            if (!saw_eacces)
                last = rc;
        } else {
            leader_fail(c, BP_STAGE_EXEC, rc);
        }
    }
    leader_fail(c, BP_STAGE_EXEC, saw_eacces ? -EACCES : last);
}

/* ---- the supervisor ------------------------------------------------------- */

BP_RAW_FN long parse_pids(const char *buf, long len, int skip, int *out, long n, long cap)
{
    long v = -1;
    for (long i = 0; i <= len; i++) {
        char ch = i < len ? buf[i] : ' ';
        if (ch >= '0' && ch <= '9') {
            v = (v < 0 ? 0 : v * 10) + (ch - '0');
        } else if (v >= 0) {
            if (v != skip && n < cap)
                out[n++] = (int)v;
            v = -1;
        }
    }
    return n;
}

BP_RAW_FN void put_str(char **p, const char *s)
{
    while (*s)
        *(*p)++ = *s++;
}

BP_RAW_FN void put_uint(char **p, unsigned long v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    while (n > 0)
        *(*p)++ = tmp[--n];
}

/* Our children from /proc/self/task/<pid>/children (a whole read, pids
 * split across reads joined), skipping `skip`. */
BP_RAW_FN long children_file(long fd, int skip, int *out, long cap)
{
    char buf[4096];
    char carry[24];
    long nc = 0, n = 0;
    for (;;) {
        long r = bp_sys3(SYS_read, fd, buf, sizeof buf);
        if (r == -EINTR)
            continue;
        if (r <= 0)
            break;
        long start = 0;
        if (nc > 0) {
            while (start < r && buf[start] >= '0' && buf[start] <= '9' && nc < 20)
                carry[nc++] = buf[start++];
            n = parse_pids(carry, nc, skip, out, n, cap);
            nc = 0;
        }
        long end = r;
        while (end > start && buf[end - 1] >= '0' && buf[end - 1] <= '9')
            end--;
        n = parse_pids(buf + start, end - start, skip, out, n, cap);
        for (long i = end; i < r && nc < 20; i++)
            carry[nc++] = buf[i];
    }
    if (nc > 0)
        n = parse_pids(carry, nc, skip, out, n, cap);
    return n;
}

/* Fallback where that file is absent: every /proc/<pid>/stat naming us as
 * the parent. */
BP_RAW_FN long children_scan(int self, int skip, int *out, long cap)
{
    long n = 0;
    long dfd = bp_sys4(SYS_openat, AT_FDCWD, "/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dfd < 0)
        return 0;
    char dbuf[4096];
    for (;;) {
        long r = bp_sys3(SYS_getdents64, dfd, dbuf, sizeof dbuf);
        if (r <= 0)
            break;
        for (long off = 0; off < r;) {
            struct linux_dirent64_ *d = (struct linux_dirent64_ *)(dbuf + off);
            off += d->d_reclen;
            if (d->d_name[0] < '0' || d->d_name[0] > '9')
                continue;
            char path[64], *q = path, stat[512];
            long pid = 0;
            for (const char *s = d->d_name; *s >= '0' && *s <= '9' && pid < (1L << 30); s++)
                pid = pid * 10 + (*s - '0');
            put_str(&q, "/proc/");
            put_uint(&q, (unsigned long)pid);
            put_str(&q, "/stat");
            *q = '\0';
            long sfd = bp_sys4(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
            if (sfd < 0)
                continue;
            long len = bp_sys3(SYS_read, sfd, stat, sizeof stat - 1);
            r_close(sfd);
            long rp = -1;
            for (long i = 0; i < len; i++)
                if (stat[i] == ')')
                    rp = i;
            if (rp < 0 || rp + 4 >= len)
                continue;
            long ppid = 0, i = rp + 4;  /* ") S PPID ..." */
            while (i < len && stat[i] >= '0' && stat[i] <= '9')
                ppid = ppid * 10 + (stat[i++] - '0');
            if (ppid == self && pid != skip && n < cap)
                out[n++] = (int)pid;
        }
    }
    r_close(dfd);
    return n;
}

BP_RAW_FN long list_children(int self, int skip, int *out, long cap)
{
    char path[64], *p = path;
    put_str(&p, "/proc/self/task/");
    put_uint(&p, (unsigned long)self);
    put_str(&p, "/children");
    *p = '\0';
    long fd = bp_sys4(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return children_scan(self, skip, out, cap);
    long n = children_file(fd, skip, out, cap);
    r_close(fd);
    return n;
}

/* One round: signal the leader's group (while it is unreaped) and every
 * adopted child and its group; reap the adopted ones that have died.
 * Returns how many adopted children there were. */
BP_RAW_FN long signal_round(int self, int leader, int group, int leader_reaped, int sig)
{
    int kids[MAX_KIDS];
    if (!leader_reaped)
        (void)bp_sys2(SYS_kill, group ? -leader : leader, sig);
    long n = list_children(self, leader, kids, MAX_KIDS);
    for (long i = 0; i < n; i++) {
        /* Each is our unreaped child: its pid, and its group id when it
         * leads one, cannot be reused while we have not reaped it. */
        if (bp_sys1(SYS_getpgid, kids[i]) == kids[i])
            (void)bp_sys2(SYS_kill, -kids[i], sig);
        (void)bp_sys2(SYS_kill, kids[i], sig);
    }
    for (long i = 0; i < n; i++)
        (void)bp_sys4(SYS_wait4, kids[i], 0, WNOHANG, 0);
    return n;
}

/* Kill everything, reap the leader, send the final report.  `alone`: the
 * leader has exited and we have no other child, so the run's whole tree is
 * gone (every live descendant would be our child or have a live parent that
 * is) and cannot grow again: no rounds after the reap are needed. */
BP_RAW_FN int finish(const struct bp_contain_ctx *c, int self, int leader, int alone)
{
    struct bp_sup_msg m;
    r_zero(&m, sizeof m);
    m.type = BP_MSG_FINAL;
    m.pid = leader;

    if (alone)
        (void)bp_sys2(SYS_kill, c->spec->new_session ? -leader : leader, SIGKILL);
    else
        (void)signal_round(self, leader, c->spec->new_session, 0, SIGKILL);
    int status = 0;
    struct rusage ru;
    r_zero(&ru, sizeof ru);
    while (bp_sys4(SYS_wait4, leader, &status, 0, &ru) == -EINTR)
        ;
    m.status = status;
    m.utime_us = (int64_t)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec;
    m.stime_us = (int64_t)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec;
    m.maxrss_kb = (int64_t)ru.ru_maxrss;

    /* Orphans keep arriving while their parents die: repeat until none is
     * left or the budget is spent. */
    int64_t until = r_now_ns() + KILL_BUDGET_NS;
    long left = 0;
    for (int round = 0; !alone; round++) {
        left = signal_round(self, leader, c->spec->new_session, 1, SIGKILL);
        while (bp_sys4(SYS_wait4, -1, 0, WNOHANG, 0) > 0)
            ;
        if (left == 0 || r_now_ns() > until)
            break;
        r_nap_ms(round < 10 ? 1 : 10);
    }
    m.unkilled = (int32_t)left;
    (void)r_write_all(c->st, &m, sizeof m);
    return 0;
}

BP_RAW_FN int supervisor_main(void *arg)
{
    struct bp_contain_ctx *c = arg;
    int self = (int)bp_sys0(SYS_getpid);
    long rc;

    /* Every signal is blocked (the core blocked them before the clone) and
     * stays blocked: SIGCHLD is read from a signalfd, and no handler of the
     * caller's may ever run in this borrowed address space. */
    unsigned long chld = 1UL << (SIGCHLD - 1);
    long sfd = bp_sys4(SYS_signalfd4, -1, &chld, 8, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        send_msg(c->st, BP_MSG_SPAWN_FAILED, 0, BP_STAGE_SUPERVISOR, (int)-sfd);
        return 1;
    }
    /* Our fd table is a copy of the caller's: drop everything but what this
     * run needs at once, so that no other run's pipe end (another thread's
     * stdin, say) is held open here while the leader starts. */
    int early[9] = {0, 1, 2, c->in_r, c->out_w, c->err_w, c->ctl, c->st, (int)sfd};
    r_close_except(early, 9);
    if ((rc = bp_sys5(SYS_prctl, PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) < 0) {
        send_msg(c->st, BP_MSG_SPAWN_FAILED, 0, BP_STAGE_PRCTL, (int)-rc);
        return 1;
    }
    int lep[2];
    if ((rc = bp_sys2(SYS_pipe2, lep, O_CLOEXEC)) < 0) {
        send_msg(c->st, BP_MSG_SPAWN_FAILED, 0, BP_STAGE_PIPE, (int)-rc);
        return 1;
    }
    /* Above stdio, or the leader's dup3 onto 0..2 would replace them. */
    for (int i = 0; i < 2; i++) {
        if (lep[i] <= 2) {
            long moved = bp_sys3(SYS_fcntl, lep[i], F_DUPFD_CLOEXEC, 3);
            r_close(lep[i]);
            if (moved < 0) {
                send_msg(c->st, BP_MSG_SPAWN_FAILED, 0, BP_STAGE_PIPE, (int)-moved);
                return 1;
            }
            lep[i] = (int)moved;
        }
    }
    c->lep_r = lep[0];
    c->lep_w = lep[1];

    long leader = bp_clone_run(CLONE_VM | CLONE_VFORK | SIGCHLD, c->leader_stack_top,
                               leader_main, c);
    r_close(c->lep_w);
    if (leader < 0) {
        send_msg(c->st, BP_MSG_SPAWN_FAILED, 0, BP_STAGE_FORK, (int)-leader);
        return 1;
    }
    int e[2];
    e[0] = e[1] = 0;
    do {
        rc = bp_sys3(SYS_read, c->lep_r, e, sizeof e);
    } while (rc == -EINTR);
    r_close(c->lep_r);
    if (rc != 0) {
        while (bp_sys4(SYS_wait4, leader, 0, 0, 0) == -EINTR)
            ;
        if (rc == (long)sizeof e)
            send_msg(c->st, BP_MSG_SPAWN_FAILED, 0, e[0], e[1]);
        else
            send_msg(c->st, BP_MSG_SPAWN_FAILED, 0, BP_STAGE_EXEC, EIO);
        return 0;
    }

    /* Hold nothing of the caller's or the run's: the pipes' EOF must mean the
     * run let go, and the command socket's EOF that the caller died. */
    int keep[3] = {c->ctl, c->st, (int)sfd};
    r_close_except(keep, 3);
    send_msg(c->st, BP_MSG_SPAWNED, (int)leader, 0, 0);

    int exited = 0;
    for (;;) {
        struct pollfd fds[2];
        fds[0].fd = c->ctl;
        fds[0].events = POLLIN;
        fds[0].revents = 0;
        fds[1].fd = (int)sfd;
        fds[1].events = POLLIN;
        fds[1].revents = 0;
        rc = bp_sys4(SYS_ppoll, fds, 2, 0, 0);
        if (rc == -EINTR)
            continue;
        if (rc < 0)
            return finish(c, self, (int)leader, 0);
        if (fds[1].revents) {
            struct signalfd_siginfo si;
            while (bp_sys3(SYS_read, sfd, &si, sizeof si) > 0)
                ;
            if (!exited) {
                siginfo_t info;
                r_zero(&info, sizeof info);
                if (bp_sys5(SYS_waitid, P_PID, leader, &info, WEXITED | WNOHANG | WNOWAIT, 0) == 0
                    && info.si_pid == leader) {
                    exited = 1;
                    int kid[1];
                    /* Nothing else left: finish now and save the core a
                     * round trip (it takes FINAL as the exit report). */
                    if (list_children(self, (int)leader, kid, 1) == 0)
                        return finish(c, self, (int)leader, 1);
                    send_msg(c->st, BP_MSG_EXITED, (int)leader, 0, 0);
                }
            }
        }
        if (fds[0].revents) {
            char ch = 0;
            rc = bp_sys6(SYS_recvfrom, c->ctl, (long)&ch, 1, 0, 0, 0);
            if (rc == -EINTR || rc == -EAGAIN)
                continue;
            if (rc <= 0 || ch == 'K')
                return finish(c, self, (int)leader, 0);
            if (ch == 'S') {
                char sig = 0;
                do {
                    rc = bp_sys6(SYS_recvfrom, c->ctl, (long)&sig, 1, 0, 0, 0);
                } while (rc == -EINTR);
                if (rc <= 0)
                    return finish(c, self, (int)leader, 0);
                (void)signal_round(self, (int)leader, c->spec->new_session, 0, (int)sig);
            }
        }
    }
}

/* ---- the core's side -------------------------------------------------------- */

/*
 * bp_contain_supported: 1 when contained runs are available here (x86_64 or
 * aarch64 Linux with PR_SET_CHILD_SUBREAPER), else 0.  errno is untouched.
 */
int bp_contain_supported(void)
{
    int v = 0;
    return bp_sys5(SYS_prctl, PR_GET_CHILD_SUBREAPER, &v, 0, 0, 0) == 0;
}

/*
 * bp__contain_clone: map the supervisor's context and stacks and clone the
 * supervisor into the caller's address space.  It inherits copies of the
 * child's pipe ends (in_r, out_w, err_w) and of its socket ends (ctl, st);
 * the caller closes its own copies.  Returns the supervisor's pid, or -1 with
 * errno set (nothing to undo); *region and *region_len receive the mapping,
 * to unmap once the supervisor has been reaped, never before.
 */
pid_t bp__contain_clone(const struct bp_spec *spec, char *const *envp, int in_r, int out_w,
                        int err_w, int ctl, int st, void **region, size_t *region_len)
{
    size_t len = CTX_SPACE + SUP_STACK + LEADER_STACK;
    unsigned char *map = mmap(NULL, len, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (map == MAP_FAILED)
        return -1;
    struct bp_contain_ctx *c = (struct bp_contain_ctx *)(void *)map;
    c->spec = spec;
    c->envp = envp;
    c->in_r = in_r;
    c->out_w = out_w;
    c->err_w = err_w;
    c->ctl = ctl;
    c->st = st;
    c->lep_r = c->lep_w = -1;
    c->leader_stack_top = map + len;
    unsigned char *sup_top = map + CTX_SPACE + SUP_STACK;

    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    long pid = bp_clone_run(CLONE_VM | SIGCHLD, sup_top, supervisor_main, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        munmap(map, len);
        errno = (int)-pid;
        return -1;
    }
    *region = map;
    *region_len = len;
    return (pid_t)pid;
}

#else /* !BP_HAVE_RAW_SYSCALLS */

int bp_contain_supported(void)
{
    return 0;
}

pid_t bp__contain_clone(const struct bp_spec *spec, char *const *envp, int in_r, int out_w,
                        int err_w, int ctl, int st, void **region, size_t *region_len)
{
    (void)spec;
    (void)envp;
    (void)in_r;
    (void)out_w;
    (void)err_w;
    (void)ctl;
    (void)st;
    (void)region;
    (void)region_len;
    errno = ENOSYS;
    return -1;
}

#endif
