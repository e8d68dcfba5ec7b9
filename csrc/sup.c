/*
 * sup.c: the core's side of a containment supervisor (supervisor.c).
 *
 * A supervisor is started once (bp_sup_start) and reused run after run; the
 * caller keeps one per thread and never shares one between two runs at once.
 * Its lifecycle, as the core sees it:
 *
 *   start    vfork-style clone (sharing our cwd, root and umask: CLONE_FS)
 *            and exec of the supervisor program with its socket as fd 3
 *            and the shared page as fd 4 (bp_supervisor.h); it answers HELLO
 *            (or the stage and errno that refused it, which the caller may
 *            take as "containment unavailable here").
 *   run      BP_CMD_RUN with the spec inline (a memfd past 48 KiB) and the
 *            child's stdio fds, and bp_start returns: nothing is waited for.
 *            The leader's pid appears in the shared page (without one: LEADER,
 *            then SPAWNED), or SPAWN_FAILED comes; EXITED; SIGNAL/KILL from
 *            us; FINAL.  A run that leaves nothing behind costs us one
 *            wakeup: FINAL with the pipes' EOF (the supervisor holds the
 *            output ends until FINAL).
 *   death    at any point the supervisor may die (a command that kills its
 *            parent, a kill from outside) or stop answering (SIGSTOP).  Every
 *            wait on it is bounded.  If it dies, the leader dies with it (its
 *            parent-death signal), and we kill the leader's group ourselves:
 *            the group id is safe to name because a group id is not reused
 *            while any member lives, and a new group with that id needs the
 *            pid counter to wrap around pid_max in the microseconds since the
 *            leader was last seen.  An unresponsive supervisor is SIGKILLed
 *            (it is our unreaped child: its pid is ours to signal) after the
 *            group kill.  The result says runner failed; the supervisor is
 *            marked unusable and replaced for the next run.
 *   free     close the socket (EOF: it kills whatever is left and exits),
 *            reap it with a bound, SIGKILL if it does not go.
 */
#include "bp_internal.h"
#include "bp_supervisor.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef __linux__
#include <sched.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#endif

#define HELLO_WAIT_MS 5000

/*
 * What a child of the calling thread inherits from it, that a supervisor took
 * once, at its start, and would hand every leader after.  Before each run the
 * core compares the calling thread's with these, and replaces a supervisor
 * whose differ (bp__sup_usable).  The cwd, root and umask need no look: the
 * supervisor shares them (CLONE_FS, bp_sup_start).  Not followed: cgroup,
 * namespaces, oom_score_adj, the capability bounding set, ambient capabilities
 * and the timer slack (each needs /proc or many calls to read: the namespace
 * links alone cost more a run than everything above; README.md).
 */
#ifdef __linux__
struct bp_origin {
    /* Who: looked at before every run (BP_ORIGIN_WHO).  A root caller that
     * dropped its ids would otherwise run its commands as root. */
    uid_t uid[3];
    gid_t gid[3];
    pid_t sid;              /* a leader that stays in our group joins it from the
                             * supervisor's session (bp_child_args.pgid) */
    int ngroups;
    uint64_t groups_hash;
    uint32_t caps[6];       /* capget, version 3: effective, permitted, inheritable x 2 */
    int no_new_privs, seccomp, securebits;
    int seccomp_filters;    /* in filter mode: how many (a caller may add more), else 0 */
    /* The rest (BP_ORIGIN_ALL): the thread's own pool, which lives as long as
     * the thread; run_many's workers start theirs for one call. */
    int personality;
    struct bp_sched_state sched;  /* limits, CPU mask, policy and nice, I/O priority */
};
#define ORIGIN_WHO_SIZE offsetof(struct bp_origin, personality)
#endif

struct bp_sup {
    pid_t pid;
    int sock;
    volatile int32_t *page; /* shared with it (bp_supervisor.h); NULL: none */
    int broken;             /* dead, unresponsive or tainted: never reuse */
    pid_t owner;            /* the process that started it */
    int pidfd;              /* held from its start, -1: none (before Linux 5.3, no fd):
                               its fate is read from it when an ignored SIGCHLD had
                               the kernel reap it (Linux 6.15) */
#ifdef __linux__
    struct bp_origin origin;  /* the starting thread's, when it started */
#endif
};

#if defined(__linux__) && defined(SOCK_SEQPACKET) && defined(SYS_memfd_create)

extern char **environ;

/* Wait up to ms for fd to be readable; 1 ready, 0 timeout, -1 error. */
static int wait_readable(int fd, int ms)
{
    int64_t until = bp__now_ns() + (int64_t)ms * 1000000;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        int64_t left = until - bp__now_ns();
        int rc = poll(&p, 1, left <= 0 ? 0 : (int)((left + 999999) / 1000000));
        if (rc >= 0)
            return rc > 0;
        if (errno != EINTR)
            return -1;
    }
}

/*
 * A command can stop its supervisor (kill -STOP $PPID) but not keep it
 * stopped: we are its parent, so waitid(WSTOPPED | WNOWAIT) tells us at once,
 * and a SIGCONT lets it serve the run again (it reports the leader's exit
 * exactly, where a stopped one would leave the run to its deadline).  Every
 * wait on the supervisor looks at most BP_SUP_CHECK_NS apart.
 */
static void revive(pid_t pid)
{
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (waitid(P_PID, (id_t)pid, &info, WSTOPPED | WNOHANG | WNOWAIT) == 0
        && info.si_pid == pid && info.si_code == CLD_STOPPED)
        (void)kill(pid, SIGCONT);
}

void bp__sup_revive(struct bp_sup *sup)
{
    if (sup != NULL && sup->pid > 0)
        revive(sup->pid);
}

/* One message; 1 read, 0 EOF (or a short record), -1 error (errno). */
static int recv_msg(int sock, struct bp_sup_msg *m)
{
    ssize_t n;
    do {
        n = recv(sock, m, sizeof *m, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -1;
    return n == (ssize_t)sizeof *m;
}

/* HELLO: 0 as this build sends it, 1 a HELLO of another size (a program of
 * another build: its leading fields, and so the version, are where ours are),
 * -1 anything else.  *m is zero-filled past what came. */
static int recv_hello(int sock, struct bp_sup_msg *m)
{
    union {
        struct bp_sup_msg m;
        char more[2 * sizeof(struct bp_sup_msg)];
    } buf;
    memset(&buf, 0, sizeof buf);
    ssize_t n;
    do {
        n = recv(sock, &buf, sizeof buf, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < (ssize_t)offsetof(struct bp_sup_msg, unkilled) || buf.m.type != BP_MSG_HELLO)
        return -1;
    *m = buf.m;
    return n != (ssize_t)sizeof *m;
}

/* waitpid(pid, WNOHANG): 1 reaped (*status set), 0 still running, -1 not ours
 * to reap (ECHILD: an ignored SIGCHLD had the kernel reap it; *status -1). */
static int try_reap(pid_t pid, int *status)
{
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid)
            return 1;
        if (r == 0)
            return 0;
        if (errno != EINTR) {
            *status = -1;
            return -1;
        }
    }
}

/* Reap the supervisor within about ms, SIGKILLing it if it does not go.
 * Returns its wait status, or -1 if it could not be reaped (an ignored
 * SIGCHLD has the kernel reap it for us: ECHILD).
 *
 * It waits on a pidfd: a supervisor let go exits within a fraction of a
 * millisecond, and retrying every millisecond made each release (run_many's
 * end, a thread's exit) take a whole sleep, about 1.1 ms.  The pidfd is the one
 * held from its start; without one (none could be made then), one opened
 * between two tries that both find the child running, so it is surely that
 * child's, never a later process's that reuses the pid.  Without pidfds
 * (before Linux 5.3), the retry loop.  When the kernel reaped it (ECHILD), the
 * status comes from the held pidfd where the kernel keeps it (Linux 6.15). */
static int reap_sup(struct bp_sup *sup, int ms, int kill_first)
{
    if (sup->pid <= 0)
        return -1;
    if (kill_first)
        (void)kill(sup->pid, SIGKILL);
    int status = -1;
    int got = try_reap(sup->pid, &status);
#ifdef SYS_pidfd_open
    if (got == 0) {
        int pfd = sup->pidfd >= 0 ? sup->pidfd : (int)syscall(SYS_pidfd_open, sup->pid, 0);
        if (pfd >= 0) {
            got = try_reap(sup->pid, &status);
            if (got == 0 && wait_readable(pfd, ms) == 1)
                got = try_reap(sup->pid, &status);
            if (pfd != sup->pidfd)
                (void)close(pfd);
            ms = 0;  /* waited already: on to the SIGKILL if it is still there */
        }
    }
#endif
    for (int i = 0; got == 0; i++) {
        if (i >= ms) {
            (void)kill(sup->pid, SIGKILL);
            while (waitpid(sup->pid, &status, 0) < 0 && errno == EINTR)
                ;
            break;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        got = try_reap(sup->pid, &status);
    }
    if (got < 0)  /* ECHILD: reaped by the kernel (the caller ignores SIGCHLD) */
        (void)bp__pidfd_exit_status(sup->pidfd, sup->pid, &status);
    sup->pid = 0;
    return status;
}

static volatile int32_t *map_page(int fd)
{
    void *p = mmap(NULL, BP_SUP_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : (volatile int32_t *)p;
}

static void unmap_page(struct bp_sup *sup)
{
    if (sup->page != NULL)
        (void)munmap((void *)sup->page, BP_SUP_PAGE_SIZE);
    sup->page = NULL;
}

/* Free what the struct holds besides the socket, and the struct. */
static void sup_dispose(struct bp_sup *sup)
{
    unmap_page(sup);
    bp__close_fd(&sup->pidfd);
    free(sup);
}

/* What the supervisor's start hands its vfork-style child. */
struct sup_exec {
    const char *path;
    char *const *argv;
    char *const *envp;
    int sock;     /* becomes its fd 3 */
    int page_fd;  /* becomes its fd 4; -1: no page */
    int errw;     /* a failed exec's stage and errno go here */
};

/* The supervisor-to-be, on the caller's memory until its exec: its socket as
 * fd 3 (dup2 clears close-on-exec), the page as fd 4, nothing else of ours:
 * every other fd is marked close-on-exec. */
static int sup_exec_child(void *arg)
{
    const struct sup_exec *x = arg;
    int kept = x->sock == BP_SUP_FD
                   ? fcntl(x->sock, F_SETFD, 0)  /* dup2 onto itself keeps CLOEXEC */
                   : dup2(x->sock, BP_SUP_FD);
    if (kept < 0)
        goto fail;
    int first_closed = BP_SUP_FD + 1;
    if (x->page_fd >= 0) {
        /* Above 4 already (lifted), so fd 4 holds nothing the socket needs. */
        if (dup2(x->page_fd, BP_SUP_PAGE_FD) < 0)
            goto fail;
        first_closed = BP_SUP_PAGE_FD + 1;
    }
    if (syscall(SYS_close_range, first_closed, ~0U, 4U) != 0) { /* CLOSE_RANGE_CLOEXEC */
        for (int fd = first_closed; fd < 65536; fd++)
            (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    (void)fcntl(x->errw, F_SETFD, FD_CLOEXEC);
    execve(x->path, x->argv, x->envp);
fail: {
        int e[2] = {BP_STAGE_EXEC, errno};
        (void)!write(x->errw, e, sizeof e);
        _exit(127);
    }
}

/* How many seccomp filters the calling thread has (a filter added is never taken away,
 * and the mode alone stays 2): "Seccomp_filters:" in its /proc status; -1 unread.  Read
 * only in filter mode, so only a caller that uses filters pays for the read. */
static int seccomp_filters(void)
{
    int fd = open("/proc/thread-self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char buf[8192];
    size_t got = 0;
    while (got < sizeof buf - 1) {
        ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    (void)close(fd);
    buf[got] = '\0';
    const char *at = strstr(buf, "\nSeccomp_filters:");
    return at == NULL ? -1 : atoi(at + sizeof "\nSeccomp_filters:" - 1);
}

/* Read the calling thread's side of what a child inherits (struct bp_origin):
 * all of it, or only who it is (BP_ORIGIN_WHO). */
static void origin_read(struct bp_origin *o, int what)
{
    memset(o, 0, sizeof *o);
    (void)getresuid(&o->uid[0], &o->uid[1], &o->uid[2]);
    (void)getresgid(&o->gid[0], &o->gid[1], &o->gid[2]);
    o->sid = getsid(0);
    gid_t small[64], *groups = small;
    int n = getgroups(64, small);
    if (n < 0 && errno == EINVAL) {  /* more than 64 */
        n = getgroups(0, NULL);
        if (n > 0 && (groups = malloc((size_t)n * sizeof *groups)) != NULL)
            n = getgroups(n, groups);
        else
            n = -1;
    }
    o->ngroups = n;  /* -1 (unread) is told apart from any list read */
    uint64_t h = 14695981039346656037ULL;  /* FNV-1a over the list */
    for (int i = 0; i < n; i++)
        h = (h ^ (uint64_t)groups[i]) * 1099511628211ULL;
    o->groups_hash = h;
    if (groups != small)
        free(groups);
    struct {
        uint32_t version;
        int pid;
    } hdr = {0x20080522 /* _LINUX_CAPABILITY_VERSION_3 */, 0};
    (void)syscall(SYS_capget, &hdr, o->caps);
    o->no_new_privs = prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0);
    o->seccomp = prctl(PR_GET_SECCOMP, 0, 0, 0, 0);
    if (o->seccomp == 2)
        o->seccomp_filters = seccomp_filters();
    o->securebits = prctl(PR_GET_SECUREBITS, 0, 0, 0, 0);
    if (what == BP_ORIGIN_WHO)
        return;
    o->personality = personality(0xffffffff);
    bp__sched_state_read(&o->sched);
}

/*
 * bp_sup_start: start a supervisor from the program at path, with envp as
 * its environment (a snapshot of the caller's: the live environ may be
 * reallocated by another thread while the vfork child reads it).
 * Returns 0 with *out set; or -1 with errno set, *out NULL and *stage the
 * BP_STAGE_* that failed: BP_STAGE_PIPE/FORK (resources: EMFILE, EAGAIN,
 * ENOMEM), BP_STAGE_EXEC (the program is missing or cannot run),
 * BP_STAGE_SUPERVISOR/PRCTL (the system refused it: signalfd, subreaper), or
 * BP_STAGE_SUPERVISOR with EPROTO (a program of another build: its HELLO does
 * not carry BP_SUP_PROTOCOL).
 */
int bp_sup_start(const char *path, char *const *envp, struct bp_sup **out, int *stage)
{
    *out = NULL;
    struct bp_sup *sup = calloc(1, sizeof *sup);
    if (sup == NULL) {
        *stage = BP_STAGE_ALLOC;
        errno = ENOMEM;
        return -1;
    }
    sup->pidfd = -1;
    int sv[2], ep[2] = {-1, -1};
    bp__fork_guard();  /* until the supervisor's ends are closed (spawn.c) */
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        int e = errno;
        bp__fork_unguard();
        free(sup);
        *stage = BP_STAGE_PIPE;
        errno = e;
        return -1;
    }
    if (bp__lift_pair(sv) < 0 || pipe2(ep, O_CLOEXEC | O_NONBLOCK) < 0) {
        int e = errno;
        bp__close_fd(&sv[0]);
        bp__close_fd(&sv[1]);
        bp__fork_unguard();
        free(sup);
        *stage = BP_STAGE_PIPE;
        errno = e;
        return -1;
    }
    /* The shared page (bp_supervisor.h); without one, the leader reports
     * itself by a message. */
    int page_fd = (int)syscall(SYS_memfd_create, "boundedproc-page", 1U /* MFD_CLOEXEC */);
    if (page_fd >= 0 && page_fd <= BP_SUP_PAGE_FD) {
        /* Above the fds the child sets up (3, 4), so no dup2() there clobbers it. */
        int moved = fcntl(page_fd, F_DUPFD_CLOEXEC, BP_SUP_PAGE_FD + 1);
        bp__close_fd(&page_fd);
        page_fd = moved;
    }
    if (page_fd >= 0 && (ftruncate(page_fd, BP_SUP_PAGE_SIZE) < 0
                         || (sup->page = map_page(page_fd)) == NULL))
        bp__close_fd(&page_fd);
    char caller[24];
    snprintf(caller, sizeof caller, "%ld", (long)getpid());
    char page_arg[8];
    snprintf(page_arg, sizeof page_arg, "%d", BP_SUP_PAGE_FD);
    char *argv[] = {(char *)path, caller, page_fd >= 0 ? page_arg : NULL, NULL};
    int child_sock = sv[1];
    int errw = ep[1];

    struct sup_exec x = {path, argv, envp, child_sock, page_fd, errw};
    origin_read(&sup->origin, BP_ORIGIN_ALL);  /* what the supervisor inherits now */
    /* CLONE_FS: the supervisor shares this process's cwd, root and umask for good
     * (its exec does not unshare them), so each leader, which gets a copy of them
     * at its start, starts where a child of the caller would start now, also
     * after an os.chdir() or os.umask() between two runs. */
    pid_t pid = bp__vfork_child(sup_exec_child, &x, CLONE_FS);
    int fork_errno = errno;
    bp__close_fd(&sv[1]);
    bp__close_fd(&ep[1]);
    bp__close_fd(&page_fd);  /* the mapping stays */
    bp__fork_unguard();
    if (pid < 0) {
        bp__close_fd(&sv[0]);
        bp__close_fd(&ep[0]);
        sup_dispose(sup);
        *stage = BP_STAGE_FORK;
        errno = fork_errno;
        return -1;
    }
    sup->pid = pid;
    sup->sock = sv[0];
    sup->owner = getpid();
#ifdef SYS_pidfd_open
    /* Right after its start (one that already died and was reaped by the kernel gives
     * ESRCH: no pidfd, no fate, as before; its pid reused within these microseconds
     * would need the whole pid space to wrap). */
    sup->pidfd = bp__lift_fd((int)syscall(SYS_pidfd_open, pid, 0));
#endif
    /* Never a blocking read to EOF: a fork between the pipe2 and the close of
     * ep[1] above would leave a copy of ep[1] in that child for as long as it
     * lives (a multiprocessing worker: the run then waited for it, past every
     * bound).  The fork guard now keeps os.fork() out of that window, but not a
     * fork that runs no atfork handlers (a raw fork or clone syscall from other
     * C code in the process).  No need either: the supervisor was started as a
     * vfork child, so we resumed only once it had exec'd or, failing that,
     * written its report. */
    int e[2] = {0, 0};
    ssize_t n;
    do {
        n = read(ep[0], e, sizeof e);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        n = 0;  /* EAGAIN: nothing written, the exec went through */
    bp__close_fd(&ep[0]);
    int fail_stage = 0, fail_err = 0, hello = -1;
    struct bp_sup_msg m;
    if (n > 0) {
        /* The supervisor program itself could not be executed (EACCES when a caller that
         * dropped its ids cannot reach the installed package): a supervisor failure, never
         * to be told as the command's own execve failing. */
        fail_stage = BP_STAGE_SUPERVISOR;
        fail_err = n == (ssize_t)sizeof e ? e[1] : EIO;
    } else if (wait_readable(sup->sock, HELLO_WAIT_MS) != 1
               || (hello = recv_hello(sup->sock, &m)) < 0) {
        fail_stage = BP_STAGE_SUPERVISOR;
        fail_err = EIO;
    } else if (hello == 0 && m.stage != 0) {
        fail_stage = m.stage;
        fail_err = m.err;
    } else if (hello == 1 || m.status != BP_SUP_PROTOCOL) {
        /* A supervisor program of another build: its messages may mean other things. */
        fail_stage = BP_STAGE_SUPERVISOR;
        fail_err = EPROTO;
    }
    if (fail_stage != 0) {
        bp__close_fd(&sup->sock);
        (void)reap_sup(sup, 1000, 0);
        sup_dispose(sup);
        *stage = fail_stage;
        errno = fail_err;
        return -1;
    }
    *out = sup;
    return 0;
}

/* bp_sup_reusable: 1 unless a run found sup dead, unresponsive or tainted;
 * no system call (bp_sup_usable still looks before the next run). */
int bp_sup_reusable(const struct bp_sup *sup)
{
    return sup != NULL && !sup->broken && sup->sock >= 0;
}

/* bp__sup_usable: 1 when sup may serve another run (in this process), from
 * this thread, with what: BP_ORIGIN_ALL, or only BP_ORIGIN_WHO of what the
 * thread's child would inherit compared (struct bp_origin). */
int bp__sup_usable(const struct bp_sup *sup, int what)
{
    if (!bp_sup_reusable(sup) || sup->owner != getpid())
        return 0;
    struct bp_origin now;
    origin_read(&now, what);
    if (memcmp(&now, &sup->origin, what == BP_ORIGIN_WHO ? ORIGIN_WHO_SIZE : sizeof now) != 0)
        return 0;  /* this thread's ids, limits, ... changed since its start */
    /* An idle supervisor sends nothing: a readable socket is its EOF (it was
     * killed between runs). */
    struct pollfd p = {sup->sock, POLLIN, 0};
    int rc;
    do {
        rc = poll(&p, 1, 0);
    } while (rc < 0 && errno == EINTR);
    return rc == 0;
}

/* bp_sup_usable: bp__sup_usable with everything compared (a thread's own pool). */
int bp_sup_usable(const struct bp_sup *sup)
{
    return bp__sup_usable(sup, BP_ORIGIN_ALL);
}

/* bp_sup_pid: the supervisor's pid (for tests and diagnostics). */
int bp_sup_pid(const struct bp_sup *sup)
{
    return sup == NULL ? 0 : (int)sup->pid;
}

/*
 * bp_sup_free: let a supervisor go: close its socket (it kills whatever is
 * left of a run and exits) and reap it, SIGKILLing it after ~200 ms.  Accepts
 * NULL.  Must not be called while a run uses it.
 */
void bp_sup_free(struct bp_sup *sup)
{
    if (sup == NULL)
        return;
    int saved = errno;
    bp__close_fd(&sup->sock);
    if (sup->owner == getpid())
        (void)reap_sup(sup, 200, 0);
    sup_dispose(sup);
    errno = saved;
}

/*
 * bp_sup_forget: release a supervisor inherited across fork(): close our
 * copy of its socket, never signal or wait for it (it is not our child).
 */
void bp_sup_forget(struct bp_sup *sup)
{
    if (sup == NULL)
        return;
    int saved = errno;
    bp__close_fd(&sup->sock);
    sup_dispose(sup);
    errno = saved;
}

static int send_cmd(struct bp_sup *sup, const struct bp_sup_cmd *cmd, const int *fds, int nfds,
                    const char *extra, size_t extra_len)
{
    char cbuf[CMSG_SPACE(sizeof(int) * 4)];
    struct iovec iov[2] = {{(void *)cmd, sizeof *cmd}, {(void *)extra, extra_len}};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    memset(cbuf, 0, sizeof cbuf);
    mh.msg_iov = iov;
    mh.msg_iovlen = extra_len > 0 ? 2 : 1;
    if (nfds > 0) {
        mh.msg_control = cbuf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t n;
    do {
        n = sendmsg(sup->sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    return n == (ssize_t)(sizeof *cmd + extra_len) ? 0 : -1;
}

static int put(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static size_t strings_len(char *const *v, int *count)
{
    size_t len = 0;
    int n = 0;
    for (; v != NULL && v[n] != NULL; n++)
        len += strlen(v[n]) + 1;
    *count = n;
    return len;
}

static char *copy_strings(char *p, char *const *v, int count)
{
    for (int i = 0; i < count; i++) {
        size_t l = strlen(v[i]) + 1;
        memcpy(p, v[i], l);
        p += l;
    }
    return p;
}

/* The spec as one blob (see bp_supervisor.h); *len its size.  NULL with
 * errno ENOMEM. */
static char *spec_blob(const struct bp_spec *spec, char *const *envp, struct bp_sup_cmd *cmd,
                       size_t *len)
{
    size_t cwd_len = spec->cwd != NULL ? strlen(spec->cwd) + 1 : 0;
    size_t groups_len = spec->ngroups > 0 ? (size_t)spec->ngroups * sizeof(uint32_t) : 0;
    *len = cwd_len + strings_len(spec->argv, &cmd->argc) + strings_len(envp, &cmd->envc)
           + strings_len(spec->exec_paths, &cmd->npaths) + groups_len;
    char *blob = malloc(*len > 0 ? *len : 1);
    if (blob == NULL)
        return NULL;
    char *p = blob;
    if (cwd_len > 0) {
        memcpy(p, spec->cwd, cwd_len);
        p += cwd_len;
        cmd->has_cwd = 1;
    }
    p = copy_strings(p, spec->argv, cmd->argc);
    p = copy_strings(p, envp, cmd->envc);
    p = copy_strings(p, spec->exec_paths, cmd->npaths);
    if (groups_len > 0)
        memcpy(p, spec->groups, groups_len);
    cmd->ngroups = spec->ngroups;
    cmd->spec_len = (int64_t)*len;
    return blob;
}

/* The spec in a pipe made large enough to hold all of it, written before RUN
 * is sent, so never blocked on.  For a caller whose RLIMIT_FSIZE (ulimit -f)
 * is below the spec's size: a memfd is a file, and writing past the limit
 * fails with EFBIG (and raises SIGXFSZ); a pipe knows no such limit.  Its size
 * is bounded by /proc/sys/fs/pipe-max-size (1 MiB by default) for an
 * unprivileged caller: past that, EFBIG stays the answer. */
static int spec_pipe(const char *blob, size_t len)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0)
        return -1;
    int size = fcntl(p[1], F_GETPIPE_SZ);
    if (size >= 0 && (size_t)size < len)
        size = len > INT_MAX ? -1 : fcntl(p[1], F_SETPIPE_SZ, (int)len);
    int rc = -1;
    if (size >= 0 && (size_t)size < len)
        errno = EFBIG;
    else if (size >= 0)
        rc = put(p[1], blob, len);
    int e = errno;
    bp__close_fd(&p[1]);
    if (rc < 0) {
        bp__close_fd(&p[0]);
        errno = e;
        return -1;
    }
    return p[0];
}

/* A spec too large for one record, in a memfd: no size limit, and a send
 * that never blocks on a slow reader (in a pipe when the caller's file size
 * limit is below it). */
static int spec_memfd(const char *blob, size_t len)
{
    struct rlimit fsize;
    if (getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY
        && (rlim_t)len > fsize.rlim_cur)
        return spec_pipe(blob, len);
    int fd = (int)syscall(SYS_memfd_create, "boundedproc-spec", 1U); /* MFD_CLOEXEC */
    if (fd < 0 || put(fd, blob, len) < 0) {
        int e = errno;
        bp__close_fd(&fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* The supervisor failed the run: note how, and never use it again. */
static void sup_failed(struct bp_run *run, int how)
{
    if (run->res->runner_failed == BP_RUNNER_OK)
        run->res->runner_failed = how;
    run->sup->broken = 1;
}

/*
 * bp__sup_spawn: hand the run's command to its supervisor.  child[] are the
 * command's stdio ends (-1: closed).  Returns 0 once the supervisor has it
 * (run->sup_pending: the leader's pid and whether its exec worked are learned
 * in the loop, so a contained start never waits for the supervisor, and a
 * signal that arrives meanwhile is handled as in any run); or -1 with *stage
 * and *err set when nothing could be handed over (then res->runner_failed
 * says whether the supervisor itself failed).
 */
int bp__sup_spawn(struct bp_run *run, const int child[3], int *stage, int *err)
{
    const struct bp_spec *spec = run->spec;
    struct bp_sup *sup = run->sup;
    run->sup_pid = sup->pid;
    run->ctl_fd = -1;
    run->exit_fd = -1;
    struct bp_sup_cmd cmd;
    memset(&cmd, 0, sizeof cmd);
    cmd.type = BP_CMD_RUN;
    cmd.new_session = spec->new_session;
    cmd.pgid = spec->new_session ? 0 : (int32_t)getpgrp();  /* ours, not the supervisor's */
    cmd.uid = spec->uid;
    cmd.gid = spec->gid;
    cmd.sig_ignore = spec->sig_ignore;
    cmd.sig_mask = spec->sig_mask;
    /* The deadline held by the supervisor too, BP_BACKSTOP_NS after ours would kill:
     * reached only when this caller did not act (stopped by Ctrl-Z or SIGSTOP, or
     * held in an on_output that blocks), so the command never outlives its bound
     * by more.  None without a deadline or with a kill_grace that never ends. */
    if (spec->timeout_ns >= 0 && spec->kill_grace_ns >= 0
        && spec->timeout_ns < INT64_MAX / 4 && spec->kill_grace_ns < INT64_MAX / 4)
        cmd.backstop_ns = spec->timeout_ns + spec->kill_grace_ns + BP_BACKSTOP_NS;
    for (int i = 0; i < BP_NRLIMITS; i++) {
        cmd.rlimits_soft[i] = spec->rlimits_soft[i];
        cmd.rlimits_hard[i] = spec->rlimits_hard[i];
    }
    char *const *envp = spec->envp != NULL ? spec->envp : environ;
    size_t len = 0;
    char *blob = spec_blob(spec, envp, &cmd, &len);
    if (blob == NULL) {
        *stage = BP_STAGE_ALLOC;
        *err = ENOMEM;
        return -1;
    }
    int memfd = -1;
    cmd.inline_spec = len <= BP_SPEC_INLINE_MAX;
    if (!cmd.inline_spec && (memfd = spec_memfd(blob, len)) < 0) {
        *stage = BP_STAGE_MEMFD;
        *err = errno;
        free(blob);
        return -1;
    }
    int fds[4] = {-1, -1, -1, -1};
    int nfds = 0;
    if (memfd >= 0)
        fds[nfds++] = memfd;
    for (int i = 0; i < 3; i++) {
        if (child[i] < 0)
            cmd.closed |= 1 << i;
        else
            fds[nfds++] = child[i];
    }
    if (sup->page != NULL)
        sup->page[0] = 0;  /* the leader writes its pid here before its exec */
    int rc = send_cmd(sup, &cmd, fds, nfds, cmd.inline_spec ? blob : NULL,
                      cmd.inline_spec ? len : 0);
    int send_errno = errno;
    free(blob);
    bp__close_fd(&memfd);
    if (rc < 0) {
        /* EPIPE/ECONNRESET: it died between runs; anything else (ENOBUFS,
         * EAGAIN on a wedged socket) is as bad for this supervisor. */
        sup_failed(run, BP_RUNNER_DIED);
        *stage = BP_STAGE_SUPERVISOR;
        *err = send_errno;
        return -1;
    }
    /* Nothing is waited for here: the leader's pid comes through the shared page (or
     * LEADER), a failed start as SPAWN_FAILED, both taken by the loop (bp__sup_event). */
    run->exit_fd = sup->sock;  /* borrowed: never closed by the run */
    run->sup_pending = 1;
    return 0;
}

/* The final kill's budget: what is left of the run's bound (SPEC 2.2 step
 * 7: timeout + kill_grace + drain_grace), so that a run whose escapees cannot
 * be killed still returns in time; never under a few rounds of kill, and at
 * most 5 s when the run has no bound.  The drain that follows gets what the
 * kill left of the bound (loop.c). */
static int64_t kill_budget(const struct bp_run *run)
{
    const int64_t floor_ns = 20000000, ceil_ns = 5000000000LL;
    if (run->bound_end_ns < 0)
        return ceil_ns;
    int64_t left = run->bound_end_ns - bp__now_ns() - 100000000;  /* 0.1 s for the rest */
    return left < floor_ns ? floor_ns : left > ceil_ns ? ceil_ns : left;
}

static void set_leader(struct bp_run *run, pid_t pid)
{
    if (pid > 0) {
        run->pid = pid;
        run->res->pid = (int)pid;
    }
}

/* The leader's pid, once known: from LEADER/SPAWNED, or from the shared page,
 * where it writes its pid just before its exec; 0 while unknown. */
static pid_t leader_pid(struct bp_run *run)
{
    if (run->pid <= 0 && run->res->spawned && run->sup->page != NULL)
        set_leader(run, run->sup->page[0]);
    return run->pid;
}

/* What the shared page says of this run's leader (zeroed before RUN): its pid once it
 * is at its exec, else 0.  Read only: the run takes it as its leader when the
 * supervisor confirms the exec (leader_pid). */
pid_t bp__sup_page_pid(const struct bp_run *run)
{
    if (run->sup == NULL || run->sup->page == NULL)
        return 0;
    pid_t pid = run->sup->page[0];
    return pid > 0 ? pid : 0;
}

/* The leader exec'd (SPAWNED, or EXITED/FINAL, which come only after an exec):
 * the start is no longer pending.  pid: the message's, or 0 (then the page's). */
static void exec_confirmed(struct bp_run *run, pid_t pid)
{
    set_leader(run, pid);
    (void)leader_pid(run);
    run->sup_pending = 0;
}

/* Kill the leader's group ourselves: nobody holds the leader unreaped any
 * more (see the header comment for why that is safe).  Nothing when its pid
 * never became known: it then died before its exec, of its parent-death
 * signal, and kill(0) would name our own group. */
static void kill_group(struct bp_run *run, int sig)
{
    pid_t pid = leader_pid(run);
    if (pid > 0)
        (void)kill(run->spec->new_session ? -pid : pid, sig);
}

/* The leader's setup or exec failed (SPAWN_FAILED), or the supervisor died
 * before its leader got as far as its exec: nothing ran, nothing is left to
 * kill or reap, and the result is a spawn failure as from an uncontained
 * start (the stdin bytes that went into the pipe reached no command). */
static void start_failed(struct bp_run *run, int stage, int err)
{
    run->sup_pending = 0;
    run->pid = 0;
    run->res->pid = 0;
    run->leader_exited = 1;
    run->reaped = 1;
    run->res->stdin_written = 0;
    run->res->stdin_delivered = run->spec->stdin_len == 0;
    bp__spawn_failed(run, stage, err);
}

/* The supervisor is gone (EOF, a garbage record, or silent past its bound). */
static void sup_lost(struct bp_run *run, int how)
{
    sup_failed(run, how);
    if (leader_pid(run) <= 0 && run->sup_pending) {
        start_failed(run, BP_STAGE_SUPERVISOR, EIO);  /* it never got to the exec */
        return;
    }
    run->sup_pending = 0;
    run->sup_dead = 1;
    if (!run->leader_exited)
        run->exit_ns = bp__now_ns();  /* no exit time came: the loss counts from now */
    run->leader_exited = 1;
}

/* A start report: 1 when m was one (taken), else 0. */
static int take_start_report(struct bp_run *run, const struct bp_sup_msg *m)
{
    if (m->type == BP_MSG_LEADER) {
        set_leader(run, m->pid);
    } else if (m->type == BP_MSG_SPAWNED) {
        exec_confirmed(run, m->pid);
    } else if (m->type == BP_MSG_SPAWN_FAILED) {
        start_failed(run, m->stage, m->err);
    } else {
        return 0;
    }
    return 1;
}

/* Signal or kill through the supervisor (contained run, leader unreaped). */
void bp__sup_signal(struct bp_run *run, int sig)
{
    if (run->sup_dead) {
        kill_group(run, sig);
        return;
    }
    if (run->sup_final) {
        /* It finished on its own (the leader exited alone): its FINAL
         * waits to be read, and nothing of the run is left to signal. */
        return;
    }
    struct bp_sup_cmd cmd;
    memset(&cmd, 0, sizeof cmd);
    cmd.type = sig == SIGKILL ? BP_CMD_KILL : BP_CMD_SIGNAL;
    cmd.sig = sig;
    cmd.budget_ns = kill_budget(run);
    if (send_cmd(run->sup, &cmd, NULL, 0, NULL, 0) < 0) {
        sup_lost(run, BP_RUNNER_DIED);
        kill_group(run, sig);
    }
}

/* FINAL: the leader's status and the run's resource use into the result. */
static void take_final(struct bp_run *run, const struct bp_sup_msg *m)
{
    struct bp_result *res = run->res;
    exec_confirmed(run, 0);
    bp__record_status(res, m->status);
    res->user_time = (double)m->utime_us / 1e6;
    res->system_time = (double)m->stime_us / 1e6;
    res->max_rss = m->maxrss_kb * 1024;
    res->unkilled = m->unkilled;
    if (m->backstop && res->end_reason == BP_END_NONE)
        res->end_reason = BP_END_DEADLINE;  /* killed at the deadline's backstop */
    if (m->err != 0 && res->err_stage == BP_STAGE_NONE) {
        res->err_stage = m->stage;  /* BP_STAGE_KILL, EPERM: a leader it could not kill */
        res->err_errno = m->err;
    }
    if (!m->reusable)
        run->sup->broken = 1;  /* it exits: something of this run lives on */
}

/* The exit fd (the supervisor's socket) is readable. */
void bp__sup_event(struct bp_run *run)
{
    struct bp_sup_msg m;
    int got = recv_msg(run->sup->sock, &m);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    if (got == 1 && take_start_report(run, &m))
        return;
    if (got == 1 && m.type == BP_MSG_EXITED) {
        exec_confirmed(run, 0);
        run->exited_status = m.status;
        run->leader_exited = 1;
        run->exit_ns = run->start_ns + m.exit_after_ns;  /* on our clock */
        return;
    }
    if (got == 1 && m.type == BP_MSG_FINAL) {
        /* It finished on its own (the leader exited alone), or the backstop
         * ended it (then no exit time: the deadline's): the run's end needs
         * nothing more from it (bp__sup_reap). */
        take_final(run, &m);
        run->leader_exited = 1;
        run->exit_ns = m.exit_after_ns > 0 ? run->start_ns + m.exit_after_ns : bp__now_ns();
        run->sup_final = 1;
        return;
    }
    /* EOF or garbage: the supervisor is gone, and the leader with it. */
    sup_lost(run, BP_RUNNER_DIED);
}

/* The supervisor died before FINAL: the leader's own status when EXITED
 * brought one that is not a success, else what a kill would report; never 0
 * (SPEC 9.2).  Its resource use went with the supervisor. */
static void record_lost_status(struct bp_run *run)
{
    int st = run->exited_status;
    if (st >= 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
        bp__record_status(run->res, st);
    else
        bp__record_unknown_status(run->res);
}

/*
 * Whether a supervisor silent past its budget is only waiting for its leader
 * to finish dying: the leader, still its child, is in the kernel's exit or a
 * zombie, and the supervisor is not stopped.  A leader with gigabytes to free
 * takes the kernel that long before its exit shows (a 4 GiB memfd: 0.6 s
 * here), and the supervisor waits for that exit before it reaps the leader
 * and kills the orphans the death hands it.  Giving it up as unanswering
 * turned a deadline into `runner failed` (a grader's unrunnable).
 */
static int only_waiting(struct bp_run *run)
{
    pid_t sup_pid = run->sup->pid;
    char name[24], state = 0;
    int ppid = 0, pgrp = 0;
    if (!bp__proc_exiting_child(leader_pid(run), sup_pid))
        return 0;
    (void)snprintf(name, sizeof name, "%d", (int)sup_pid);
    return bp__proc_stat(name, &state, &ppid, &pgrp, NULL) == 0
           && state != 'T' && state != 't' && state != 'Z';
}

/* How long a let-go supervisor may take to finish before it is SIGKILLed. */
#define LET_GO_CAP_NS 30000000000LL

/* A let-go supervisor's watcher: continued whenever the command stopped it (nobody
 * else looks any more), reaped when it exits, SIGKILLed past LET_GO_CAP_NS.  It
 * looks every BP_SUP_CHECK_NS and holds no fd (a fork of the caller would inherit
 * it, with no thread to close it). */
static void *watch_let_go(void *p)
{
    pid_t pid = (pid_t)(intptr_t)p;
    int64_t until = bp__now_ns() + LET_GO_CAP_NS;
    int status = 0;
    while (try_reap(pid, &status) == 0) {
        if (bp__now_ns() > until) {
            (void)kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            break;
        }
        revive(pid);
        struct timespec ts = {0, BP_SUP_CHECK_NS};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* Let a supervisor that is only waiting (only_waiting) finish on its own: it
 * reaps the leader, kills what the death hands it, finds its socket closed and
 * exits, watched by a thread of ours.  The leader got the run's SIGKILL; its
 * status and resource use stay with the supervisor.  0 when no thread could
 * watch it (then it is given up as before). */
static int let_sup_go(struct bp_run *run)
{
    struct bp_sup *sup = run->sup;
    pthread_t thread;
    if (bp__quiet_thread(&thread, 64 * 1024, 1, watch_let_go, (void *)(intptr_t)sup->pid) != 0)
        return 0;
    sup->pid = 0;  /* the watcher's now: not ours to signal or wait for any more */
    kill_group(run, SIGKILL);
    sup->broken = 1;
    bp__close_fd(&sup->sock);
    run->reaped = 1;
    run->sup_let_go = 1;
    record_lost_status(run);
    return 1;
}

/*
 * bp__sup_reap: end a contained run: have the supervisor kill everything and
 * reap the leader, and read its FINAL report; bounded by the run's budget
 * plus a margin, also while a signal (wake_fd) asks us to hurry.  A start
 * that turns out to have failed (SPAWN_FAILED, which comes instead of FINAL)
 * ends it too.  On any failure of the supervisor, kill the group ourselves
 * and SIGKILL and reap the supervisor.  Returns 0 (failures are in
 * res->runner_failed).
 */
int bp__sup_reap(struct bp_run *run)
{
    struct bp_sup *sup = run->sup;
    run->exit_fd = -1;
    if (run->sup_final) {
        run->reaped = 1;  /* its FINAL was taken as it came (bp__sup_event) */
        return 0;
    }
    if (!run->sup_dead && !run->sigkill_sent)
        bp__signal_group(run, SIGKILL);
    int64_t until = bp__now_ns() + kill_budget(run) + 300000000;
    int final = 0;
    struct bp_sup_msg m;
    while (!run->sup_dead && !final) {
        int64_t left = (until - bp__now_ns()) / 1000000;
        if (left <= 0 && only_waiting(run) && let_sup_go(run))
            return 0;
        if (left <= 0) {
            sup_lost(run, BP_RUNNER_UNRESPONSIVE);
            break;
        }
        if (left > BP_SUP_CHECK_NS / 1000000)
            left = BP_SUP_CHECK_NS / 1000000;
        struct pollfd p[2] = {{sup->sock, POLLIN, 0}, {run->spec->wake_fd, POLLIN, 0}};
        int rc = poll(p, run->spec->wake_fd >= 0 ? 2 : 1, (int)left);
        if (rc == 0)
            bp__sup_revive(sup);  /* silent so far: stopped by the command? */
        if (rc < 0 && errno != EINTR) {
            /* Ours failed (ENOMEM): the leader's fate is unknown, and the result
             * says why (runner failed: ... poll), never a bare 137. */
            if (run->res->err_stage == BP_STAGE_NONE) {
                run->res->err_stage = BP_STAGE_POLL;
                run->res->err_errno = errno;
            }
            break;
        }
        if (rc > 0 && run->spec->wake_fd >= 0 && p[1].revents) {
            /* Ctrl-C while we wait: keep waiting, but not for long. */
            int64_t soon = bp__now_ns() + 300000000;
            if (soon < until)
                until = soon;
        }
        if (rc <= 0 || !p[0].revents)
            continue;
        int got = recv_msg(sup->sock, &m);
        if (got == -1 && (errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (got != 1) {
            sup_lost(run, BP_RUNNER_DIED);
            break;
        }
        if (take_start_report(run, &m) && !run->res->spawned)
            return 0;  /* SPAWN_FAILED: nothing ran, and the supervisor is fine */
        final = m.type == BP_MSG_FINAL;
    }
    run->reaped = 1;
    if (final) {
        take_final(run, &m);
        return 0;
    }
    /* It died or did not answer: the group (if the leader got as far as its
     * exec) is ours to kill now. */
    kill_group(run, SIGKILL);
    sup->broken = 1;
    run->res->runner_status = reap_sup(sup, 100, 1);
    kill_group(run, SIGKILL);
    if (run->res->spawned)
        record_lost_status(run);
    return 0;
}

#else /* no supervisor on this system */

pid_t bp__sup_page_pid(const struct bp_run *run)
{
    (void)run;
    return 0;
}

int bp_sup_start(const char *path, char *const *envp, struct bp_sup **out, int *stage)
{
    (void)path;
    (void)envp;
    *out = NULL;
    *stage = BP_STAGE_SUPERVISOR;
    errno = ENOSYS;
    return -1;
}

int bp__sup_usable(const struct bp_sup *sup, int what)
{
    (void)sup;
    (void)what;
    return 0;
}

int bp_sup_usable(const struct bp_sup *sup)
{
    (void)sup;
    return 0;
}

int bp_sup_reusable(const struct bp_sup *sup)
{
    (void)sup;
    return 0;
}

int bp_sup_pid(const struct bp_sup *sup)
{
    (void)sup;
    return 0;
}

void bp_sup_free(struct bp_sup *sup)
{
    (void)sup;
}

void bp_sup_forget(struct bp_sup *sup)
{
    (void)sup;
}

int bp__sup_spawn(struct bp_run *run, const int child[3], int *stage, int *err)
{
    (void)run;
    (void)child;
    *stage = BP_STAGE_SUPERVISOR;
    *err = ENOSYS;
    return -1;
}

void bp__sup_signal(struct bp_run *run, int sig)
{
    (void)run;
    (void)sig;
}

void bp__sup_revive(struct bp_sup *sup)
{
    (void)sup;
}

void bp__sup_event(struct bp_run *run)
{
    (void)run;
}

int bp__sup_reap(struct bp_run *run)
{
    (void)run;
    return 0;
}

#endif

/*
 * bp_contain_supported: 1 when contained runs can be asked for here (Linux
 * with PR_SET_CHILD_SUBREAPER), else 0.  errno is untouched.
 */
int bp_contain_supported(void)
{
#if defined(__linux__) && defined(PR_GET_CHILD_SUBREAPER) && defined(SYS_memfd_create)
    int saved = errno;
    int v = 0;
    int ok = prctl(PR_GET_CHILD_SUBREAPER, &v, 0, 0, 0) == 0;
    errno = saved;
    return ok;
#else
    return 0;
#endif
}
