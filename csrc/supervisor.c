/*
 * supervisor.c: the containment supervisor, a small program of its own.
 *
 * Why a program (exec'd once, then reused for run after run) and not a clone
 * of the caller:
 *   - it has its own memory: when the caller is OOM-killed (which kills every
 *     process sharing the victim's memory) or corrupts its heap, the
 *     supervisor lives on and kills the run;
 *   - it starts from a clean state: no inherited signal disposition (an
 *     ignored SIGCHLD would make the kernel reap our children behind our
 *     back), no fd of the caller's but its socket, its own errno, so it can
 *     use libc freely;
 *   - reused, its exec is paid once per calling thread, not per run.
 *
 * Its life: it is the child of one calling thread (the core keeps one per
 * thread, see boundedproc/_native.py), in a process group of its own (so that
 * a SIGKILL of the caller's group spares it to kill the run), a child
 * subreaper, and waits for
 * BP_CMD_RUN on its socket (bp_supervisor.h).  For each run it starts the
 * leader with the shared pre-exec steps (bp_child.h), beside it rather than
 * waiting for the exec (start_leader), reaps
 * adopted orphans as they die (their CPU time is summed into the run's), and
 * at BP_CMD_KILL kills the leader's group and every process it adopted,
 * reaps them all, reports, and is ready for the next run.  Nothing of one
 * run survives into the next: a supervisor that could not kill everything
 * (an escapee it may not signal) reports reusable=0 and exits.
 *
 * It shares its caller's cwd, root and umask (started with CLONE_FS, which
 * its exec keeps), so each leader starts with the caller's current ones:
 * nothing here may chdir, chroot or set the umask, which would change the
 * caller's.  The rest of what a child inherits (ids, limits, affinity, ...)
 * is the caller's as of our start; the core replaces us when those change
 * (sup.c, struct bp_origin), and we exit when a command changed ours
 * ("What a leader inherits from us").
 *
 * It dies with its caller: the caller's pidfd becomes readable when the
 * caller's process exits (whatever killed it, even the OOM killer); the
 * parent-death signal (DEATH_SIGNAL, read from a signalfd and accepted only
 * from the kernel on behalf of the caller) fires when the calling thread exits;
 * and the socket reads EOF when the core lets go.  Any of them: kill
 * everything, reap, exit.  The leader gets PR_SET_PDEATHSIG(SIGKILL) before
 * its exec, so if the supervisor itself is killed, the leader dies with it
 * and the core kills the group (sup.c).
 *
 * Finding the orphans: /proc/self/task/TID/children, but only when /proc
 * belongs to our pid namespace (/proc/self names our own pid); otherwise
 * (a pid namespace without its own /proc) the pids after the leader's are
 * probed with waitid(WNOHANG|WNOWAIT), which only ever answers for our own
 * children, so a bystander is never signalled.
 */
#include "bp_internal.h"
#include "bp_child.h"
#include "bp_supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_KIDS 4096
/* Our parent-death signal: the last real-time one, which nothing sends a
 * process group by custom (drain_signals). */
#define DEATH_SIGNAL SIGRTMAX
#define PROBE_SPAN 32768
#define DEFAULT_BUDGET_NS 2000000000LL
#define SETTLE_SIGNAL_MS 100  /* how long a signal waits for a start to settle */

/* What every leader inherits from us and a process of a run can change in us from
 * outside ("What a leader inherits from us", below). */
struct inherited {
    struct bp_sched_state sched;  /* limits, CPU mask, policy and nice, I/O priority */
    long slack;
    long session_keyring; /* its id (KEYCTL_SESSION_TO_PARENT replaces ours); -1: none */
    uint64_t proc_hash;   /* over oom_score_adj, coredump_filter and cgroup, as read */
};

#define INHERITED_FILES 3

struct sup {
    pid_t self;
    pid_t caller;
    int sock;
    int sfd;              /* signalfd: SIGCHLD, DEATH_SIGNAL (parent death) */
    int caller_fd;        /* pidfd of the caller's process, -1: none */
    int proc_ok;          /* /proc is our namespace's */
    int kids_fd;          /* /proc/self/task/TID/children, open for good; -1: none */
    volatile int32_t *page;  /* the page shared with the core (bp_supervisor.h), or NULL */
    int held[2];          /* the child's stdout and stderr ends, held until FINAL; -1: none */
    int parent_died;      /* the kernel's DEATH_SIGNAL was read (drain_signals) */
    /* the current run */
    pid_t leader;
    int new_session;
    int exited;
    int64_t started_ns;   /* when RUN came */
    int64_t exit_after_ns; /* when exited was seen, after started_ns (bp_sup_msg) */
    int64_t backstop_at;  /* when to kill the run ourselves (bp_sup_cmd.backstop_ns); 0: never */
    int backstop_hit;     /* it was killed then, its leader still running: FINAL says so */
    int64_t utime_us, stime_us, maxrss_kb;
    /* Its start (start_leader), which the leader reads on our memory until its exec:
     * kept as it is until the leader is reaped (end_start). */
    struct bp_child_args args;
    struct bp_child_error report;  /* the leader's: a failed pre-exec step */
    uint32_t groups[256];
    char *blob, **argv, **envp, **paths;
    int exec_fd;          /* reads EOF once the leader exec'd or exited; -1: settled */
    int leader_fd;        /* the leader's pidfd, until it is reaped; -1: none */
    int inherited_fd[INHERITED_FILES];  /* /proc/self's oom_score_adj, coredump_filter,
                                         * cgroup; -1: none */
    int clear_refs_fd;    /* /proc/self/clear_refs, opened while we were dumpable; -1: none */
    struct inherited start;    /* as at our start */
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + (int64_t)ts.tv_nsec;
}

static void send_msg(const struct sup *s, struct bp_sup_msg *m)
{
    ssize_t n;
    do {
        n = send(s->sock, m, sizeof *m, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
}

static void send_simple(const struct sup *s, int type, int pid, int stage, int err)
{
    struct bp_sup_msg m;
    memset(&m, 0, sizeof m);
    m.type = type;
    m.pid = pid;
    m.stage = stage;
    m.err = err;
    if (type == BP_MSG_HELLO)
        m.status = BP_SUP_PROTOCOL;  /* checked by the core (bp_supervisor.h) */
    send_msg(s, &m);
}

/* EXITED: the leader's status as peeked (still unreaped), so that the core
 * has it even if we die before FINAL (SPEC 9.2); NULL: not known yet (a
 * traced leader: serve()). */
static void send_exited(const struct sup *s, const siginfo_t *info)
{
    struct bp_sup_msg m;
    memset(&m, 0, sizeof m);
    m.type = BP_MSG_EXITED;
    m.pid = (int)s->leader;
    m.exit_after_ns = s->exit_after_ns;
    if (info == NULL)
        m.status = 0;  /* the core's fallback then is a kill's status (sup.c) */
    else if (info->si_code == CLD_EXITED)
        m.status = (info->si_status & 0xff) << 8;
    else  /* CLD_KILLED, CLD_DUMPED */
        m.status = (info->si_status & 0x7f) | (info->si_code == CLD_DUMPED ? 0x80 : 0);
    send_msg(s, &m);
}

static void account(struct sup *s, const struct rusage *ru)
{
    s->utime_us += (int64_t)ru->ru_utime.tv_sec * 1000000 + ru->ru_utime.tv_usec;
    s->stime_us += (int64_t)ru->ru_stime.tv_sec * 1000000 + ru->ru_stime.tv_usec;
    if ((int64_t)ru->ru_maxrss > s->maxrss_kb)
        s->maxrss_kb = (int64_t)ru->ru_maxrss;
}

/* Reap one child that is known to have died (or may have: WNOHANG). */
static int reap_one(struct sup *s, pid_t pid, int flags, int *status)
{
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    int st = 0;
    pid_t r;
    do {
        r = wait4(pid, &st, flags, &ru);
    } while (r < 0 && errno == EINTR);
    if (r > 0) {
        account(s, &ru);
        if (status != NULL)
            *status = st;
    }
    return r > 0;
}

/* ---- our children ---------------------------------------------------------- */

static long parse_pids(const char *buf, size_t len, pid_t skip, pid_t *out, long n)
{
    long v = -1;
    for (size_t i = 0; i <= len; i++) {
        char ch = i < len ? buf[i] : ' ';
        if (ch >= '0' && ch <= '9') {
            v = (v < 0 ? 0 : v * 10) + (ch - '0');
        } else if (v >= 0) {
            if (v != skip && n < MAX_KIDS)
                out[n++] = (pid_t)v;
            v = -1;
        }
    }
    return n;
}

/* What fd holds, from offset 0, into buf (at most size bytes): the count.  A read at 0
 * of a children file is one consistent walk of the list by the kernel. */
static size_t read_whole(int fd, char *buf, size_t size)
{
    size_t got = 0;
    for (;;) {
        ssize_t r = pread(fd, buf + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || (got += (size_t)r) == size)
            return got;
    }
}

/* Every child of ours but `skip`, from /proc when it is ours, else probed. */
static long list_children(struct sup *s, pid_t skip, pid_t *out)
{
    long n = 0;
    if (s->kids_fd < 0 && s->proc_ok) {
        /* Opened once, at the first need (again after a failure such as ENFILE:
         * the probe below is far slower). */
        char path[64];
        snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)s->self);
        s->kids_fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (s->kids_fd >= 0) {
        /* Read from offset 0 each time: the kernel walks our children list
         * afresh for a read at 0 (one read of a large buffer sees one
         * consistent walk), and the file stays open, so the common case costs
         * two reads, not an open of /proc as well. */
        static char buf[MAX_KIDS * 12];
        return parse_pids(buf, read_whole(s->kids_fd, buf, sizeof buf), skip, out, 0);
    }
    /* Probe: a descendant's pid was allocated after the leader's. */
    pid_t base = s->leader > 0 ? s->leader : 1;
    for (long i = 1; i <= PROBE_SPAN && n < MAX_KIDS; i++) {
        long p = (long)base + i;
        if (p > (1L << 22))
            p -= (1L << 22);
        if ((pid_t)p == skip || (pid_t)p == s->self)
            continue;
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_PID, (id_t)p, &info, WEXITED | WSTOPPED | WCONTINUED | WNOHANG | WNOWAIT) == 0)
            out[n++] = (pid_t)p;
    }
    return n;
}

/* Reap every adopted orphan that has died (never the leader: its zombie
 * keeps the group id ours).  Returns how many children other than the
 * leader were found once the leader exited, the ones just reaped included (a
 * child reaped after the look may have handed us children the look missed),
 * or -1 when that was not counted (the leader lives). */
static long reap_orphans(struct sup *s)
{
    for (;;) {
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) < 0)
            return 0;  /* ECHILD: nobody at all */
        if (info.si_pid == 0)
            return -1;
        if (info.si_pid == s->leader) {
            /* The first zombie in the list is the leader: reap the others
             * by name. */
            pid_t kids[MAX_KIDS];
            long n = list_children(s, s->leader, kids);
            for (long i = 0; i < n; i++)
                (void)reap_one(s, kids[i], WNOHANG, NULL);
            return n;
        }
        (void)reap_one(s, info.si_pid, WNOHANG, NULL);
    }
}

/* Let go of the child's output ends: with FINAL sent first, the core finds
 * both at its one wakeup (bp_supervisor.h). */
static void release_held(struct sup *s)
{
    for (int i = 0; i < 2; i++) {
        if (s->held[i] >= 0)
            (void)close(s->held[i]);
        s->held[i] = -1;
    }
}

/* ---- what a leader inherits from us ----------------------------------------------- */

/*
 * A leader inherits our resource limits, scheduling policy and nice value, CPU
 * mask, I/O priority, timer slack, session keyring, OOM score adjustment, core
 * dump filter and cgroup.  A process of a run can change each of ours from
 * outside: it runs as our user (or as root), and $PPID names us (prlimit,
 * renice, chrt, taskset, ionice, keyctl's KEYCTL_SESSION_TO_PARENT,
 * /proc/$PPID/oom_score_adj or timerslack_ns, a cgroup's cgroup.procs).
 * Every later command would then start with the change, a hostile check's
 * `prlimit --pid $PPID --fsize=0` failing the honest checks after it.  The core
 * compares only its own thread's values (sup.c, struct bp_origin), so we take
 * ours at our start and look again at the end of each run, before FINAL, which
 * then says we may not be reused (and we exit).  The rest of our state only we
 * can change, or a tracer: we are not dumpable (main), so a command of our user
 * cannot trace us, write our memory or take our fds.
 *
 * Before FINAL, not after it: FINAL wakes the core on our CPU (a socket's wakeup
 * expects the sender to sleep next), and a look after it kept the core waiting
 * for the CPU, 35 us a run, where the look itself costs about 12 us (with the
 * files held open: opened and closed each time, 33; benchmarks/README.md).
 */
static void inherited_read(const struct sup *s, struct inherited *in)
{
    memset(in, 0, sizeof *in);
    bp__sched_state_read(&in->sched);
    in->slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
#ifdef SYS_keyctl
    in->session_keyring = syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */,
                                  -3 /* KEY_SPEC_SESSION_KEYRING */, 0);
#endif
    uint64_t h = 14695981039346656037ULL;  /* FNV-1a over the files, each with its length */
    for (int i = 0; i < INHERITED_FILES; i++) {
        char buf[4096];
        /* One read: each file is small, and generated whole for a read at 0. */
        ssize_t n = s->inherited_fd[i] >= 0 ? pread(s->inherited_fd[i], buf, sizeof buf, 0) : 0;
        h = (h ^ (uint64_t)n) * 1099511628211ULL;
        for (ssize_t k = 0; k < n; k++)
            h = (h ^ (unsigned char)buf[k]) * 1099511628211ULL;
    }
    in->proc_hash = h;
}

/* At our start: open the files for good and take the values. */
static void inherited_start(struct sup *s)
{
    static const char *const names[INHERITED_FILES] = {
        "/proc/self/oom_score_adj", "/proc/self/coredump_filter", "/proc/self/cgroup"};
    for (int i = 0; i < INHERITED_FILES; i++)
        s->inherited_fd[i] = open(names[i], O_RDONLY | O_CLOEXEC);  /* -1: not followed */
    inherited_read(s, &s->start);
}

/* At a run's end: whether something of ours that a leader inherits was changed. */
static int inherited_changed(const struct sup *s)
{
    struct inherited now;
    inherited_read(s, &now);
    return memcmp(&now, &s->start, sizeof now) != 0;
}

/*
 * Signals a process sent us stay pending: every one is blocked, and only SIGCHLD
 * and DEATH_SIGNAL are read (the signalfd).  Each counts against its user's
 * RLIMIT_SIGPENDING, so a command that queued real-time signals to $PPID until
 * the limit would have left every later command of that user (and the caller)
 * unable to queue one (timer_create, sigqueue: EAGAIN) for as long as we live.
 * At each run's end the pending ones are dropped: a pending signal set to
 * SIG_IGN is discarded, all its queued instances with it.  One system call when
 * none is pending.
 */
static void discard_pending(void)
{
#ifdef SYS_rt_sigpending
    uint64_t pending = 0;  /* bit s-1: signal s (the kernel's sigset_t, 64 signals) */
    if (syscall(SYS_rt_sigpending, &pending, sizeof pending) < 0 || pending == 0)
        return;
    for (int sig = 1; sig <= 64 && sig < NSIG; sig++) {
        if (!((pending >> (sig - 1)) & 1) || sig == SIGCHLD || sig == DEATH_SIGNAL
            || sig == SIGKILL || sig == SIGSTOP)
            continue;
        (void)bpc_ignore(sig);  /* raw: also the C library's own (32, 33) */
        (void)bpc_default_action(sig);
    }
#endif
}

/* What every run's end looks at, before FINAL: whether we may serve another run. */
static int run_end_reusable(const struct sup *s)
{
    discard_pending();
    return !inherited_changed(s);
}

/* A start that failed, or a RUN we could not take: if something of ours a leader
 * inherits was changed from outside (another thread's command set our
 * RLIMIT_NPROC or RLIMIT_NOFILE: the start failed for it), exit without a word.
 * The core sees our end, and a run on a supervisor taken up again whose command
 * never started goes once more on a fresh one (_native.execute, batch.c), where
 * it starts.  Reported as a failure, it would fail every later run of the thread. */
static void exit_if_changed(const struct sup *s)
{
    if (inherited_changed(s))
        _exit(0);
}

/* ---- the leader's start -------------------------------------------------------- */

/* The leader is reaped: let go of what its start kept (start_leader). */
static void end_start(struct sup *s)
{
    free(s->paths);
    free(s->envp);
    free(s->argv);
    if (s->blob != NULL) {
        free(s->blob);
        /* A spec too large to come inline (argv and env past 48 KiB) raised our peak
         * RSS, and a leader, which runs on our memory until its exec, takes our peak as
         * the floor of its own (the kernel carries it over at exec): every later
         * command's max_rss would start there.  Reset to what we hold now. */
        if (s->clear_refs_fd >= 0)
            (void)pwrite(s->clear_refs_fd, "5", 1, 0);
    }
    s->paths = s->envp = s->argv = NULL;
    s->blob = NULL;
    if (s->exec_fd >= 0)
        (void)close(s->exec_fd);
    s->exec_fd = -1;
    if (s->leader_fd >= 0)
        (void)close(s->leader_fd);
    s->leader_fd = -1;
}

/* Wait up to ms for the leader's start to settle: it exec'd, or it exited
 * (the exec pipe's write end, which only the leader holds, closed).  1
 * settled, 0 not yet. */
static int settle_start(struct sup *s, int ms)
{
    if (s->exec_fd < 0)
        return 1;
    struct pollfd p = {s->exec_fd, POLLIN, 0};
    int rc;
    do {
        rc = poll(&p, 1, ms);
    } while (rc < 0 && errno == EINTR);
    if (rc <= 0)
        return 0;
    (void)close(s->exec_fd);
    s->exec_fd = -1;
    return 1;
}

/* The settled start failed: a pre-exec step (or every execve) failed, and the
 * leader wrote why just before it exited. */
static int start_failed(struct sup *s)
{
    volatile struct bp_child_error *report = &s->report;
    return s->leader > 0 && s->exec_fd < 0 && report->stage != BP_STAGE_NONE;
}

/* A failed start: reap the leader (exiting, with no child: nothing ran), report
 * SPAWN_FAILED in place of FINAL, and be ready for the next run. */
static void report_start_failed(struct sup *s)
{
    int status = 0;
    (void)reap_one(s, s->leader, 0, &status);
    exit_if_changed(s);
    send_simple(s, BP_MSG_SPAWN_FAILED, 0, s->report.stage, s->report.err);
    s->leader = 0;
    s->exited = 0;
    release_held(s);
    end_start(s);
}

/* The leader exited and no other child is left: the run's whole tree is
 * gone (every live descendant would be our child, or have a live parent
 * that is) and cannot grow again.  Kill the group (the rule, and harmless),
 * reap the leader and report, with no round of orphan hunting. */
static void finish_alone(struct sup *s)
{
    struct bp_sup_msg m;
    memset(&m, 0, sizeof m);
    m.type = BP_MSG_FINAL;
    m.pid = (int32_t)s->leader;
    m.exit_after_ns = s->exit_after_ns;
    (void)kill(s->new_session ? -s->leader : s->leader, SIGKILL);
    int status = 0;
    (void)reap_one(s, s->leader, 0, &status);
    end_start(s);
    m.status = status;
    m.reusable = run_end_reusable(s);
    m.utime_us = s->utime_us;
    m.stime_us = s->stime_us;
    m.maxrss_kb = s->maxrss_kb;
    s->leader = 0;
    s->exited = 0;
    send_msg(s, &m);
    release_held(s);
    if (!m.reusable)
        _exit(0);  /* changed by the run: never reuse us */
}

/* Signal the leader's group (while the leader is unreaped) and every
 * adopted child and its group, then reap those that died.  Returns how many
 * children other than the leader were found, zombies included; *alive (may
 * be NULL) gets how many of them are still unreaped. */
static long signal_round(struct sup *s, int leader_reaped, int sig, long *alive)
{
    pid_t kids[MAX_KIDS];
    if (!leader_reaped && s->leader > 0) {
        (void)kill(s->new_session ? -s->leader : s->leader, sig);
        if (s->new_session && s->exec_fd >= 0)
            (void)kill(s->leader, sig);  /* it may not lead its session yet */
    }
    long n = list_children(s, s->leader, kids);
    for (long i = 0; i < n; i++) {
        /* Each is our unreaped child: its pid, and its group id when it
         * leads one, cannot be reused meanwhile. */
        if (getpgid(kids[i]) == kids[i])
            (void)kill(-kids[i], sig);
        (void)kill(kids[i], sig);
    }
    long left = 0;
    for (long i = 0; i < n; i++)
        if (!reap_one(s, kids[i], WNOHANG, NULL))
            left++;
    if (alive != NULL)
        *alive = left;
    return n;
}

static int drain_signals(struct sup *s, int *chld);

/* SIGKILL pid, listed as a child of parent (or, reparented meanwhile, of
 * ours): the pidfd pins the process whose parent was checked, so a pid reused
 * in between is never signalled.  Returns 1 when it was signalled, -1 when it
 * is that child but may not be signalled (EPERM), 0 when it is gone or not
 * that child. */
static int kill_child_of(struct sup *s, pid_t parent, pid_t pid)
{
    int pfd = -1;
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
    pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd < 0 && errno == ESRCH)
        return 0;
#endif
    char name[24], state = 0;
    int ppid = 0, pgrp = 0, rc = 0, ours = 0;
    snprintf(name, sizeof name, "%d", (int)pid);
    if (bp__proc_stat(name, &state, &ppid, &pgrp, NULL) == 0
            && (ppid == parent || ppid == s->self)) {
        ours = 1;
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
        if (pfd >= 0)
            rc = (int)syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0);
        else
#endif
            rc = kill(pid, SIGKILL);
    }
    int err = errno;
    if (pfd >= 0)
        (void)close(pfd);
    if (!ours || (rc < 0 && err != EPERM))
        return 0;
    return rc < 0 ? -1 : 1;
}

/* Append the children of pid (of each of its threads) to out[*n...]. */
static void list_children_of(pid_t pid, pid_t *out, long *n, long cap)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    static char buf[MAX_KIDS * 12];
    struct dirent *e;
    while ((e = readdir(d)) != NULL && *n < cap) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char file[96];
        snprintf(file, sizeof file, "/proc/%d/task/%.20s/children", (int)pid, e->d_name);
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        size_t got = read_whole(fd, buf, sizeof buf);
        (void)close(fd);
        *n = parse_pids(buf, got, 0, out, *n);
    }
    closedir(d);
}

/* Whether pid is among list[0..n). */
static int listed_in(const pid_t *list, long n, pid_t pid)
{
    for (long i = 0; i < n; i++)
        if (list[i] == pid)
            return 1;
    return 0;
}

/*
 * The final kill's budget is spent and children are left unreaped.  Each got
 * SIGKILL in the last round, so each is on its way out, but one that has not
 * died yet has not handed us its children either, and they may be in no group
 * we signalled (setsid).  Kill the rest of the tree from the top down: a
 * process is signalled before its children are listed, and one with SIGKILL
 * pending forks no more, so each list is final.  One that dies before its
 * list is read has handed its children to us instead: our own children are
 * listed again until none is new.  Returns how many processes may not be
 * signalled (EPERM: one that changed its ids), which are what the run could
 * not kill; -1 when /proc is not ours, or the tree is too large to walk (then
 * nothing here can say all were killed).
 */
static long kill_dying_tree(struct sup *s)
{
    if (!s->proc_ok)
        return -1;
    static pid_t tree[MAX_KIDS], kids[MAX_KIDS];  /* every process signalled; ours now */
    long n = 0, refused = 0;
    for (;;) {
        long nk = list_children(s, 0, kids), walked = n;
        for (long i = 0; i < nk; i++) {
            if (listed_in(tree, walked, kids[i]))
                continue;
            if (n == MAX_KIDS)
                return -1;
            if (kill(kids[i], SIGKILL) < 0 && errno == EPERM)  /* ours, unreaped: a stable pid */
                refused++;
            tree[n++] = kids[i];
        }
        if (n == walked)
            return refused;  /* every child of ours was signalled, and its tree below it */
        for (long i = walked; i < n; i++) {
            long first = n, listed = n;
            list_children_of(tree[i], tree, &listed, MAX_KIDS);
            if (listed == MAX_KIDS)
                return -1;
            for (long j = first; j < listed; j++) {
                int got = kill_child_of(s, tree[i], tree[j]);
                if (got < 0)
                    refused++;
                if (got != 0)  /* walked in turn: only a process known to be of the tree */
                    tree[n++] = tree[j];
            }
        }
    }
}

/* Wait up to ms for a child to die (SIGCHLD on the signalfd), without losing a
 * parent death read meanwhile (drain_signals keeps it).  Killed processes die
 * within microseconds; sleeping the whole ms instead cost a run that left an
 * orphan about 1.2 ms, and one more for each round. */
static void await_child(struct sup *s, int ms)
{
    struct pollfd p = {s->sfd, POLLIN, 0};
    if (poll(&p, 1, ms) > 0) {
        int chld = 0;
        (void)drain_signals(s, &chld);
    }
}

/*
 * Whether the leader, just sent SIGKILL, may not be signalled by us (EPERM: it
 * runs as another user, as a setuid program that took root for good, or a
 * command under sudo, started by a caller that is not root) and is still
 * running 100 ms later.  A blocking reap would then wait for as long as it
 * chooses to run, past every bound of the run.
 */
static int leader_unkillable(struct sup *s)
{
    if (s->leader <= 0 || kill(s->leader, 0) == 0 || errno != EPERM)
        return 0;
    for (int i = 0;; i++) {
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_PID, (id_t)s->leader, &info, WEXITED | WNOHANG | WNOWAIT) == 0
                && info.si_pid != 0)
            return 0;  /* it exited after all: the caller reaps it, status and all */
        if (i == 10)
            return 1;
        await_child(s, 10);
    }
}

/*
 * Reap the leader, just sent SIGKILL.  Returns 1 when reaped (*status set), 0
 * when its zombie is still held at `until`.  A leader traced by a process of
 * the run (a child of its that left the session and PTRACE_SEIZEd it: no
 * privilege needed) is a zombie that only its tracer may wait for, until the
 * tracer does or dies: a blocking wait waited for as long as the tracer chose,
 * and the core gave us up.  The tracer became our child when the leader died,
 * so the rounds here kill it, and the zombie comes to us.  Held at `until`: a
 * tracer that is no descendant of the run (a debugger), or one we may not kill.
 */
static int reap_leader(struct sup *s, int64_t until, int *status)
{
    if (s->leader_fd >= 0) {
        /* Until it is dead, as the blocking wait did: a leader slow to die
         * (freeing its memory) has not yet handed its children to us. */
        struct pollfd p = {s->leader_fd, POLLIN, 0};
        while (poll(&p, 1, -1) < 0 && errno == EINTR)
            ;
    }
    if (reap_one(s, s->leader, s->leader_fd >= 0 ? WNOHANG : 0, status))
        return 1;
    /* Dead and held: the tracer is ours now.  At least 100 ms for it to die. */
    int64_t at_least = now_ns() + 100000000;
    if (until < at_least)
        until = at_least;
    for (int round = 0;; round++) {
        (void)signal_round(s, 0, SIGKILL, NULL);  /* the tracer among our children */
        await_child(s, round < 10 ? 1 : 10);
        if (reap_one(s, s->leader, WNOHANG, status))
            return 1;
        if (now_ns() > until)
            return 0;
    }
}

/* Kill everything, reap the leader and every orphan, report FINAL. */
static void finish(struct sup *s, int64_t budget_ns, int report)
{
    int64_t until = now_ns() + (budget_ns > 0 ? budget_ns : DEFAULT_BUDGET_NS);
    /* A start still on its way to the exec is let finish first (bounded): one
     * that fails is a spawn failure, never a command killed. */
    (void)settle_start(s, (int)((until - now_ns()) / 1000000));
    if (start_failed(s)) {
        report_start_failed(s);
        return;
    }
    struct bp_sup_msg m;
    memset(&m, 0, sizeof m);
    m.type = BP_MSG_FINAL;
    m.pid = (int32_t)s->leader;
    m.exit_after_ns = s->exited ? s->exit_after_ns : 0;
    (void)signal_round(s, 0, SIGKILL, NULL);
    int status = 0;
    int unkillable = leader_unkillable(s);
    if (unkillable) {
        /* Left running, our child until we exit (then init's): its status is
         * unknown, reported as a kill's, with why (the core's runner_error). */
        status = SIGKILL;
        m.stage = BP_STAGE_KILL;
        m.err = EPERM;
    } else if (!reap_leader(s, until, &status)) {
        /* Held by a tracer we could not kill: its status is not ours to know
         * (the core's runner_error: wait4, EBUSY), and we exit, as above. */
        unkillable = 1;
        status = SIGKILL;
        m.stage = BP_STAGE_WAIT;
        m.err = EBUSY;
    }
    end_start(s);
    m.status = status;

    /*
     * Orphans keep arriving while their parents die: a parent hands its
     * children to us as it exits, before it turns zombie, so one that a round
     * found, killed and reaped may have handed us children that round never
     * listed.  The run is over only when a round finds no child at all (the
     * list holds zombies too): then no descendant is left anywhere, since a
     * live one would have a live ancestor among our children.  Repeat until
     * then or until the budget is spent.
     */
    long found = 0, left = 0;
    for (int round = 0;; round++) {
        found = signal_round(s, 1, SIGKILL, &left);
        while (reap_one(s, -1, WNOHANG, NULL))
            ;
        if (found == 0 || now_ns() > until)
            break;
        if (left > 0)
            await_child(s, round < 10 ? 1 : 10);
    }
    if (found > 0) {
        /* Out of budget with children not yet seen dead: what could not be
         * killed (never reuse us: something of this run is still dying). */
        long refused = kill_dying_tree(s);
        left = refused >= 0 ? refused : left > 0 ? left : 1;
    }
    m.unkilled = (int32_t)left + unkillable;
    m.reusable = found == 0 && !unkillable && run_end_reusable(s);
    m.backstop = s->backstop_hit;
    m.utime_us = s->utime_us;
    m.stime_us = s->stime_us;
    m.maxrss_kb = s->maxrss_kb;
    s->leader = 0;
    s->exited = 0;
    if (report)
        send_msg(s, &m);
    release_held(s);
    if (!m.reusable)
        _exit(0);  /* something of this run lives on, is still dying or changed us */
}

/* ---- one run ----------------------------------------------------------------- */

struct run_fds {
    int spec;
    int std[3];
};

/* An inline spec lands here (the supervisor serves one run at a time). */
static char inline_spec[BP_SPEC_INLINE_MAX + 1];

/* One command; idle 0 (during a run): the inline spec buffer, which the
 * leader may still be reading, is not offered (a RUN then reads truncated).
 * Returns 0 (cmd->type 0: none to act on), -1 at the core's EOF, or 1 for a
 * whole RUN whose fds could not be taken. */
static int recv_cmd(struct sup *s, struct bp_sup_cmd *cmd, struct run_fds *fds, int idle)
{
    char cbuf[CMSG_SPACE(sizeof(int) * 4)];
    struct iovec iov[2] = {{cmd, sizeof *cmd}, {inline_spec, BP_SPEC_INLINE_MAX}};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = idle ? 2 : 1;
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    fds->spec = -1;
    fds->std[0] = fds->std[1] = fds->std[2] = -1;
    ssize_t n;
    do {
        n = recvmsg(s->sock, &mh, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n <= 0)
        return -1;  /* EOF: the core let go */
    int got[4] = {-1, -1, -1, -1};
    int ngot = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < k && ngot < 4; i++)
                memcpy(&got[ngot++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
    }
    size_t want = sizeof *cmd;
    if (n >= (ssize_t)sizeof *cmd && cmd->type == BP_CMD_RUN && cmd->inline_spec)
        want += (size_t)cmd->spec_len;
    if (n != (ssize_t)want || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        for (int i = 0; i < ngot; i++)
            close(got[i]);
        /* A RUN whose fds could not be taken (MSG_CTRUNC: out of fds) must still be
         * answered, or the core waits for a start that never comes. */
        int untaken = n == (ssize_t)want && cmd->type == BP_CMD_RUN;
        cmd->type = 0;
        return untaken;
    }
    if (cmd->type == BP_CMD_RUN) {
        int k = 0;
        fds->spec = !cmd->inline_spec && k < ngot ? got[k++] : -1;
        for (int i = 0; i < 3; i++)
            if (!(cmd->closed & (1 << i)))
                fds->std[i] = k < ngot ? got[k++] : -1;
    } else {
        for (int i = 0; i < ngot; i++)
            close(got[i]);
    }
    return 0;
}

/* Split n NUL-terminated strings starting at *p into a NULL-terminated array. */
static char **split(char **p, char *end, int n)
{
    char **v = calloc((size_t)n + 1, sizeof *v);
    if (v == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        if (*p >= end) {
            free(v);
            return NULL;
        }
        v[i] = *p;
        *p += strlen(*p) + 1;
    }
    return v;
}

/* The leader's stack while it runs on our memory (one run at a time). */
#define LEADER_STACK_SIZE (64 * 1024)
static char leader_stack[LEADER_STACK_SIZE] __attribute__((aligned(64)));

/*
 * Start the leader; returns its pid, or 0 after reporting SPAWN_FAILED.
 *
 * With the shared page (and raw system calls in the child: BP_CHILD_BESIDE)
 * we do not wait for its exec: it runs its pre-exec steps on our memory while
 * we go back to our poll, and a failed step is learned when it exits (its
 * report, start_failed).  Waiting, as vfork does, cost every run two context
 * switches: our sleep at the clone and our wakeup at its exec.  The exec pipe
 * (close-on-exec, its write end held by the leader alone) tells us when the
 * start has settled, for the rare run that must be signalled before then
 * (settle_start).  Without the page the leader's pid reaches the core only by
 * our SPAWNED, which must follow its exec: then we wait, as before.
 */
static pid_t start_leader(struct sup *s, const struct bp_sup_cmd *cmd, struct run_fds *fds)
{
    int stage = BP_STAGE_MEMFD, err = EINVAL;
    pid_t pid = 0;
    size_t got = 0;
    if (cmd->spec_len <= 0 || cmd->spec_len > (1LL << 31))
        goto fail;
    if (cmd->inline_spec) {
        got = (size_t)cmd->spec_len;
        inline_spec[got] = '\0';
    } else {
        if (fds->spec < 0)
            goto fail;
        s->blob = malloc((size_t)cmd->spec_len + 1);
        if (s->blob == NULL) {
            err = ENOMEM;
            goto fail;
        }
        int piped = 0;  /* a pipe, not a memfd (sup.c: spec_pipe): read, not pread */
        while (got < (size_t)cmd->spec_len) {
            size_t want = (size_t)cmd->spec_len - got;
            ssize_t r = piped ? read(fds->spec, s->blob + got, want)
                              : pread(fds->spec, s->blob + got, want, (off_t)got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && errno == ESPIPE && !piped) {
                piped = 1;
                continue;
            }
            if (r <= 0) {
                err = r < 0 ? errno : EIO;
                goto fail;
            }
            got += (size_t)r;
        }
        s->blob[got] = '\0';
    }
    char *base = cmd->inline_spec ? inline_spec : s->blob;
    char *p = base, *end = base + got;
    const char *cwd = NULL;
    if (cmd->has_cwd) {
        cwd = p;
        p += strlen(p) + 1;
    }
    if ((s->argv = split(&p, end, cmd->argc)) == NULL
        || (s->envp = split(&p, end, cmd->envc)) == NULL
        || (s->paths = split(&p, end, cmd->npaths)) == NULL)
        goto fail;
    int ngroups = cmd->ngroups;
    if (ngroups > (int)(sizeof s->groups / sizeof s->groups[0]))
        goto fail;
    if (ngroups > 0) {
        if (p + (size_t)ngroups * sizeof(uint32_t) > end)
            goto fail;
        memcpy(s->groups, p, (size_t)ngroups * sizeof(uint32_t));
    }

    struct bp_child_args *a = &s->args;
    memset(a, 0, sizeof *a);
    a->exec_paths = s->paths;
    a->argv = s->argv;
    a->envp = s->envp;
    a->cwd = cwd;
    a->in = fds->std[0];
    a->out = fds->std[1];
    a->err = fds->std[2];
    a->report = &s->report;
    a->clean_parent = 1;  /* main(): every disposition default, every signal blocked */
    a->new_session = cmd->new_session;
    a->sig_ignore = cmd->sig_ignore;
    a->sig_mask = cmd->sig_mask;
    a->pgid = (pid_t)cmd->pgid;
    a->rlimits_soft = cmd->rlimits_soft;  /* serve()'s caller keeps cmd for the run */
    a->rlimits_hard = cmd->rlimits_hard;
    a->uid = cmd->uid;
    a->gid = cmd->gid;
    a->groups = s->groups;
    a->ngroups = ngroups;
    a->parent = s->self;
    a->leader_slot = s->page;
    a->hello_fd = s->sock;
    int wait_exec = 1;
#ifdef BP_CHILD_BESIDE
    /* A system that refuses clone(CLONE_VM) without CLONE_VFORK or CLONE_THREAD
     * (qemu-user running another architecture's binaries, valgrind) gets the
     * waiting start from then on. */
    static int beside_refused;
    int ep[2];
    if (s->page != NULL && !beside_refused && pipe2(ep, O_CLOEXEC) == 0) {
        wait_exec = 0;
        s->exec_fd = ep[0];
    }
#endif
    pid = bp_child_start(a, leader_stack, sizeof leader_stack, NULL, wait_exec, &stage, &err);
#ifdef BP_CHILD_BESIDE
    if (!wait_exec) {
        (void)close(ep[1]);  /* now only the leader holds it */
        if (pid < 0 && (err == EINVAL || err == ENOSYS || err == EPERM)) {
            (void)close(s->exec_fd);
            s->exec_fd = -1;
            wait_exec = 1;
            pid = bp_child_start(a, leader_stack, sizeof leader_stack, NULL, 1, &stage, &err);
            beside_refused = pid > 0 || stage != BP_STAGE_FORK;
        }
    }
#endif
    if (pid < 0) {
        pid = 0;
        goto fail;
    }
    if (wait_exec)
        end_start(s);  /* it exec'd: nothing of ours is read any more */
    return pid;

fail:
    end_start(s);
    exit_if_changed(s);
    send_simple(s, BP_MSG_SPAWN_FAILED, 0, stage, err);
    return 0;
}

static void close_run_fds(struct run_fds *fds)
{
    if (fds->spec >= 0)
        close(fds->spec);
    for (int i = 0; i < 3; i++)
        if (fds->std[i] >= 0)
            close(fds->std[i]);
    fds->spec = fds->std[0] = fds->std[1] = fds->std[2] = -1;
}

/* DEATH_SIGNAL from the kernel on the calling thread's exit (parent death),
 * not one a command sent us: the kernel's carries SI_USER and the caller's
 * pid, which no other process can forge.  The caller itself could (kill of
 * our pid): it is the kernel's only for a signal the caller has no reason to
 * send.  SIGHUP once served, and a caller that broadcast a reload
 * (killpg(getpgrp(), SIGHUP)) ended every run in flight, when we were still
 * in its process group (we lead our own now, see main). */
static int drain_signals(struct sup *s, int *chld)
{
    struct signalfd_siginfo si;
    while (read(s->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGCHLD)
            *chld = 1;
        else if ((int)si.ssi_signo == DEATH_SIGNAL && si.ssi_code == SI_USER
                 && (pid_t)si.ssi_pid == s->caller)
            s->parent_died = 1;  /* kept: await_child may have read it */
    }
    return s->parent_died || getppid() != s->caller;
}

/* The leader's exit is seen now: when, for the core's deadline (bp_sup_msg). */
static void seen_exit(struct sup *s)
{
    int64_t after = now_ns() - s->started_ns;
    s->exit_after_ns = after > 0 ? after : 1;
}

/* Serve one run from its RUN command to FINAL.  Returns 0, or -1 when the
 * supervisor must exit (the caller is gone). */
static int serve(struct sup *s, const struct bp_sup_cmd *cmd, struct run_fds *fds)
{
    s->utime_us = s->stime_us = s->maxrss_kb = 0;
    s->new_session = cmd->new_session;
    s->exited = 0;
    s->backstop_hit = 0;
    s->started_ns = now_ns();
    s->backstop_at = cmd->backstop_ns > 0 ? s->started_ns + cmd->backstop_ns : 0;
    s->leader = start_leader(s, cmd, fds);
    if (s->leader > 0) {
        /* Hold the output ends until FINAL (bp_supervisor.h); nothing else
         * of the run's: stdin's EOF is the command's. */
        s->held[0] = fds->std[1];
        s->held[1] = fds->std[2];
        fds->std[1] = fds->std[2] = -1;
    }
    close_run_fds(fds);
    if (s->leader <= 0)
        return 0;
#ifdef SYS_pidfd_open
    /* Our unreaped child: the pid is surely its.  Its exit shows here also when
     * a tracer keeps the SIGCHLD and the zombie from us (see below). */
    s->leader_fd = (int)syscall(SYS_pidfd_open, s->leader, 0);
#endif
    if (s->page == NULL)
        send_simple(s, BP_MSG_SPAWNED, (int)s->leader, 0, 0);  /* else its pid is in the page */

    for (;;) {
        int wait_ms = s->caller_fd >= 0 ? -1 : 1000;
        if (s->backstop_at > 0) {
            /* The caller's kill is due by now and did not come: the run is over. */
            int64_t left = s->backstop_at - now_ns();
            if (left <= 0) {
                s->backstop_hit = !s->exited;
                finish(s, 0, 1);
                return 0;
            }
            int64_t ms = (left + 999999) / 1000000;
            if (wait_ms < 0 || ms < wait_ms)
                wait_ms = ms > INT32_MAX ? INT32_MAX : (int)ms;
        }
        struct pollfd p[4] = {{s->sock, POLLIN, 0}, {s->sfd, POLLIN, 0}};
        int n = 2, at_caller = -1, at_leader = -1;
        if (s->caller_fd >= 0) {
            p[n] = (struct pollfd){s->caller_fd, POLLIN, 0};
            at_caller = n++;
        }
        if (s->leader_fd >= 0 && !s->exited) {
            p[n] = (struct pollfd){s->leader_fd, POLLIN, 0};
            at_leader = n++;
        }
        int rc = poll(p, (nfds_t)n, wait_ms);
        if (rc < 0 && errno != EINTR) {
            finish(s, 0, 1);
            return -1;
        }
        if (at_caller >= 0 && p[at_caller].revents) {
            finish(s, 0, 0);
            return -1;
        }
        int gone = at_leader >= 0 && p[at_leader].revents;
        if (p[1].revents || gone) {
            int chld = gone;
            if (p[1].revents && drain_signals(s, &chld)) {
                finish(s, 0, 0);
                return -1;
            }
            if (chld && !s->exited) {
                siginfo_t info;
                memset(&info, 0, sizeof info);
                if (waitid(P_PID, (id_t)s->leader, &info, WEXITED | WNOHANG | WNOWAIT) == 0
                    && info.si_pid == s->leader) {
                    s->exited = 1;
                    seen_exit(s);
                    (void)settle_start(s, 0);  /* it exited: settled */
                    if (start_failed(s)) {
                        report_start_failed(s);
                        return 0;
                    }
                    if (reap_orphans(s) == 0) {
                        finish_alone(s);  /* saves the core a round trip */
                        return 0;
                    }
                    send_exited(s, &info);
                } else if (gone) {
                    /* Its exit shows on the pidfd, but the zombie is its tracer's
                     * (a process of the run's that PTRACE_SEIZEd it), and so was the
                     * SIGCHLD.  The run ends as at any exit: the final kill kills the
                     * tracer, and the zombie comes to us, status and all (reap_leader). */
                    s->exited = 1;
                    seen_exit(s);
                    (void)settle_start(s, 0);
                    (void)reap_orphans(s);
                    send_exited(s, NULL);
                } else {
                    (void)reap_orphans(s);
                }
            } else if (chld) {
                (void)reap_orphans(s);
            }
        } else if (rc == 0 && getppid() != s->caller) {
            finish(s, 0, 0);
            return -1;
        }
        if (p[0].revents) {
            struct bp_sup_cmd c;
            struct run_fds none;
            if (recv_cmd(s, &c, &none, 0) < 0) {
                finish(s, 0, 0);  /* the core let go: as KILL, then exit */
                return -1;
            }
            if (c.type == BP_CMD_KILL) {
                finish(s, c.budget_ns, 1);
                return 0;
            }
            if (c.type == BP_CMD_SIGNAL) {
                /* The signal is for the command: let a start on its way settle first
                 * (one stuck before its exec gets it anyway, signal_round). */
                (void)settle_start(s, SETTLE_SIGNAL_MS);
                if (start_failed(s)) {
                    report_start_failed(s);
                    close_run_fds(&none);
                    return 0;
                }
                (void)signal_round(s, 0, c.sig, NULL);
            }
            close_run_fds(&none);
        }
    }
}

/* /proc names our own pid as "self": it belongs to our pid namespace. */
static int proc_is_ours(pid_t self)
{
    char buf[32];
    ssize_t n = readlink("/proc/self", buf, sizeof buf - 1);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    return atol(buf) == (long)self;
}

int main(int argc, char **argv)
{
    struct sup s;
    memset(&s, 0, sizeof s);
    s.sock = BP_SUP_FD;
    s.caller_fd = -1;
    s.held[0] = s.held[1] = -1;
    s.exec_fd = -1;
    s.leader_fd = -1;
    if (argc > 2 && atoi(argv[2]) == BP_SUP_PAGE_FD) {  /* the core passed the page */
        void *page = mmap(NULL, BP_SUP_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED,
                          BP_SUP_PAGE_FD, 0);
        s.page = page == MAP_FAILED ? NULL : page;
        (void)close(BP_SUP_PAGE_FD);
    }
    s.self = getpid();
    s.caller = argc > 1 ? (pid_t)atol(argv[1]) : getppid();

    /* The caller may run with 0, 1 or 2 closed, and we inherit that: fill them with
     * /dev/null, so that every fd we make or receive lies above the child's stdio and
     * no dup2() onto 0..2 in a child can clobber another of its sources. */
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) < 0) {
            int null = open("/dev/null", O_RDWR | O_CLOEXEC);
            if (null >= 0 && null != fd) {
                close(null);  /* not the lowest free fd: nothing to fill */
                break;
            }
        }
    }

    /* A clean signal state whatever we inherited: every disposition default
     * (an inherited SIG_IGN for SIGCHLD would have the kernel reap our
     * children), every signal blocked; SIGCHLD and DEATH_SIGNAL come through a
     * signalfd, and nothing a command sends us runs a handler.  The C library's own
     * signals too (bpc_default_actions): every leader of ours would inherit them. */
    bpc_default_actions();
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    sigset_t watched;
    sigemptyset(&watched);
    sigaddset(&watched, SIGCHLD);
    sigaddset(&watched, DEATH_SIGNAL);

    int stage = 0, err = 0;
    if ((s.sfd = signalfd(-1, &watched, SFD_CLOEXEC | SFD_NONBLOCK)) < 0) {
        stage = BP_STAGE_SUPERVISOR;
        err = errno;
    } else if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) {
        stage = BP_STAGE_PRCTL;
        err = errno;
    } else if (prctl(PR_SET_PDEATHSIG, DEATH_SIGNAL, 0, 0, 0) < 0) {
        stage = BP_STAGE_PRCTL;
        err = errno;
    }
    /* Not dumpable: a command of our user (our $PPID's child, running as we do) could
     * otherwise ptrace us, write /proc/$PPID/mem or take our fds (pidfd_getfd), and so
     * run code in the process that starts every later command, or change what it shares
     * with the caller (the cwd and umask).  Root keeps CAP_SYS_PTRACE; each leader's
     * exec makes it dumpable again as any program is. */
    s.clear_refs_fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);  /* end_start */
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (getppid() != s.caller)
        return 0;  /* the calling thread is already gone */
    /* A process group of our own: a SIGKILL of the caller's whole group (`kill -9
     * -PGID`, `kill -9 %1` in a shell, `timeout -s KILL` around the caller) must not
     * take us with it, or the leader dies of its parent-death signal and the rest of
     * its group lives on.  We see the caller go and kill the run.  A leader that must
     * stay in the caller's group (new_session 0) joins it (bp_child_args.pgid). */
    (void)setpgid(0, 0);
#ifdef SYS_pidfd_open
    s.caller_fd = (int)syscall(SYS_pidfd_open, s.caller, 0);
    if (s.caller_fd >= 0)
        (void)fcntl(s.caller_fd, F_SETFD, FD_CLOEXEC);
#endif
    s.proc_ok = proc_is_ours(s.self);
    s.kids_fd = -1;  /* opened at the first need (list_children) */
    inherited_start(&s);
    send_simple(&s, BP_MSG_HELLO, (int)s.self, stage, err);
    if (stage != 0)
        return 1;

    for (;;) {
        if (s.parent_died)
            return 0;  /* read while a run ended (await_child) */
        struct pollfd p[3] = {{s.sock, POLLIN, 0}, {s.sfd, POLLIN, 0}, {s.caller_fd, POLLIN, 0}};
        int rc = poll(p, s.caller_fd >= 0 ? 3 : 2, s.caller_fd >= 0 ? -1 : 1000);
        if (rc < 0 && errno != EINTR)
            return 1;
        if (s.caller_fd >= 0 && p[2].revents)
            return 0;
        if (p[1].revents) {
            int chld = 0;
            if (drain_signals(&s, &chld))
                return 0;
            while (reap_one(&s, -1, WNOHANG, NULL))
                ;
        } else if (rc == 0 && getppid() != s.caller) {
            return 0;
        }
        if (p[0].revents) {
            struct bp_sup_cmd cmd;
            struct run_fds fds;
            int got = recv_cmd(&s, &cmd, &fds, 1);
            if (got < 0)
                return 0;  /* the core let go */
            if (got == 1) {  /* a RUN we could not take: out of fds */
                exit_if_changed(&s);
                send_simple(&s, BP_MSG_SPAWN_FAILED, 0, BP_STAGE_SUPERVISOR, EMFILE);
            } else if (cmd.type == BP_CMD_RUN) {
                if (serve(&s, &cmd, &fds) < 0)
                    return 0;
            } else {
                close_run_fds(&fds);
            }
        }
    }
}
