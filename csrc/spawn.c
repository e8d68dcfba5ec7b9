/*
 * spawn.c: start the child with vfork semantics.
 *
 * The parent's address space is never copied: vfork() lends it to the child
 * until execve() or _exit(), so the cost of a spawn does not grow with the
 * caller's memory.  While it is lent, the child writes nothing the parent
 * reads except through the error pipe, calls only async-signal-safe
 * functions, and allocates nothing: everything it needs was prepared first.
 */
#include "bp_internal.h"
#include "bp_child.h"
#include "bp_supervisor.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif

#ifdef __APPLE__
/* A shared library cannot link against `environ` on macOS. */
#include <crt_externs.h>
#define environ (*_NSGetEnviron())
#else
extern char **environ;
#endif


/* What the child reports over the error pipe when it cannot exec. */
struct child_error {
    int stage;
    int err;
};

/* Everything the child needs, computed before vfork(). */
struct child_ctx {
    const struct bp_spec *spec;
    int in_r;
    int out_w;
    int err_w;
    int errpipe_w;
    pid_t parent;           /* the caller's pid, to detect its death before exec */
};

/* Move fd to 3 or above so that dup2() onto 0..2 in the child never
 * clobbers another of our pipe ends (the caller may have closed its stdio). */
static int move_above_stdio(int fd)
{
    if (fd < 0 || fd > 2)
        return fd;
    int nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    int saved = errno;
    close(fd);
    errno = saved;
    return nfd;
}

/* Move both ends of a new pair above stdio; on failure close both. */
static int lift_pair(int p[2])
{
    p[0] = move_above_stdio(p[0]);
    p[1] = move_above_stdio(p[1]);
    if (p[0] < 0 || p[1] < 0) {
        int saved = errno;
        if (p[0] >= 0)
            close(p[0]);
        if (p[1] >= 0)
            close(p[1]);
        p[0] = p[1] = -1;
        errno = saved;
        return -1;
    }
    return 0;
}

static int make_pipe(int p[2])
{
#ifdef __linux__
    if (pipe2(p, O_CLOEXEC) < 0)
        return -1;
#else
    if (pipe(p) < 0)
        return -1;
    if (fcntl(p[0], F_SETFD, FD_CLOEXEC) < 0 || fcntl(p[1], F_SETFD, FD_CLOEXEC) < 0) {
        int saved = errno;
        close(p[0]);
        close(p[1]);
        errno = saved;
        return -1;
    }
#endif
    return lift_pair(p);
}

/* A close-on-exec socket pair, both ends above stdio. */
static int make_socketpair(int p[2])
{
#ifdef SOCK_CLOEXEC
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) < 0)
        return -1;
#else
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, p) < 0)
        return -1;
    (void)fcntl(p[0], F_SETFD, FD_CLOEXEC);
    (void)fcntl(p[1], F_SETFD, FD_CLOEXEC);
#endif
    return lift_pair(p);
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -1;
    return fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

__attribute__((noreturn)) static void child_fail(int fd, int stage, int err)
{
    struct child_error ce;
    ce.stage = stage;
    ce.err = err;
    ssize_t n;
    do {
        n = write(fd, &ce, sizeof ce);
    } while (n < 0 && errno == EINTR);
    _exit(BP_SPAWN_FAILURE_EXIT_CODE);
}

static int rlimit_resource(int index)
{
    switch (index) {
    case BP_RLIMIT_CPU: return RLIMIT_CPU;
    case BP_RLIMIT_AS: return RLIMIT_AS;
#ifdef RLIMIT_NPROC
    case BP_RLIMIT_NPROC: return RLIMIT_NPROC;
#endif
    case BP_RLIMIT_FSIZE: return RLIMIT_FSIZE;
    case BP_RLIMIT_NOFILE: return RLIMIT_NOFILE;
    default: return -1;
    }
}

/* Runs in the vfork child: set up and exec, or report why not and _exit. */
__attribute__((noreturn, noinline)) static void child_main(const struct child_ctx *c)
{
    const struct bp_spec *spec = c->spec;
    int efd = c->errpipe_w;

    /* All signals are still blocked here (the parent blocked them before
     * vfork), so no handler can run in this borrowed address space. */
    bp_child_default_signals();

    if (spec->new_session && setsid() < 0)
        child_fail(efd, BP_STAGE_SETSID, errno);

    if (bp_child_stdio(c->in_r, c->out_w, c->err_w) < 0)
        child_fail(efd, BP_STAGE_DUP, errno);

    bp_child_close_fds(efd);

    for (int i = 0; i < BP_NRLIMITS; i++) {
        if (spec->rlimits_soft[i] < 0 && spec->rlimits_hard[i] < 0)
            continue;
        int resource = rlimit_resource(i);
        if (resource < 0)
            child_fail(efd, BP_STAGE_RLIMIT, EINVAL);
        struct rlimit rl;
        if (getrlimit(resource, &rl) < 0)
            child_fail(efd, BP_STAGE_RLIMIT, errno);
        if (spec->rlimits_soft[i] >= 0)
            rl.rlim_cur = (rlim_t)spec->rlimits_soft[i];
        if (spec->rlimits_hard[i] >= 0)
            rl.rlim_max = (rlim_t)spec->rlimits_hard[i];
        if (setrlimit(resource, &rl) < 0)
            child_fail(efd, BP_STAGE_RLIMIT, errno);
    }

    if (spec->cwd != NULL && chdir(spec->cwd) < 0)
        child_fail(efd, BP_STAGE_CHDIR, errno);

    char *const *envp = spec->envp != NULL ? spec->envp : environ;

#ifdef __linux__
    /* Uncontained run: at least the leader dies with the caller.  The
     * signal fires when the spawning thread exits; that thread is blocked in
     * the run for the leader's whole life, so this means the caller died. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        child_fail(efd, BP_STAGE_PRCTL, errno);
    if (getppid() != c->parent)
        _exit(BP_SPAWN_FAILURE_EXIT_CODE);  /* the caller is already gone */
#endif

    sigset_t none;
    sigemptyset(&none);
    (void)sigprocmask(SIG_SETMASK, &none, NULL);
    child_fail(efd, BP_STAGE_EXEC, bp_child_exec(spec->exec_paths, spec->argv, envp));
}

/* vfork with every signal blocked, so that no handler of the caller runs in
 * the borrowed address space; the child empties its mask before exec.  Kept
 * in a frame of its own so no caller variable is live across vfork(). */
__attribute__((noinline)) static pid_t spawn_child(const struct child_ctx *ctx, int *err)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = vfork();
    if (pid == 0)
        child_main(ctx);
    *err = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return pid;
}

static void close_pair(int p[2])
{
    bp__close_fd(&p[0]);
    bp__close_fd(&p[1]);
}

static void spawn_failed(struct bp_run *run, int stage, int err)
{
    struct bp_result *res = run->res;
    res->spawned = 0;
    res->err_stage = stage;
    res->err_errno = err;
    res->exit_code = BP_SPAWN_FAILURE_EXIT_CODE;
    if (stage == BP_STAGE_EXEC) {
        switch (err) {
        case EACCES:
        case ENOEXEC:
        case EPERM:
        case EISDIR:
        case ETXTBSY:
            res->exit_code = BP_CANNOT_EXECUTE_EXIT_CODE;
            break;
        default:
            break;
        }
    }
}

static ssize_t read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

/* Read the supervisor's first report: the leader's pid, or why it failed. */
static void read_spawn_report(int st, pid_t *leader, int *stage, int *err)
{
    struct bp_sup_msg m;
    ssize_t n = read_full(st, &m, sizeof m);
    if (n == (ssize_t)sizeof m && m.type == BP_MSG_SPAWNED) {
        *leader = m.pid;
    } else if (n == (ssize_t)sizeof m && m.type == BP_MSG_SPAWN_FAILED) {
        *stage = m.stage;
        *err = m.err;
    } else {
        *stage = BP_STAGE_SUPERVISOR;
        *err = EIO;
    }
}

/*
 * bp__spawn: create the pipes and start the child (for a contained run, the
 * supervisor that starts it: contain.c).
 * Returns 0.  When the OS refuses (pipe, vfork/clone, setsid, chdir,
 * setrlimit, execve, or the supervisor failed), res->spawned is 0 and
 * err_stage/err_errno say why; no fd is left open and no child unreaped.  On
 * success res->spawned is 1 and run->pid (the leader), run->stdin_fd,
 * run->out.fd, run->err.fd are set; for a contained run also run->sup_pid,
 * run->ctl_fd, run->exit_fd (the supervisor's status socket) and its region.
 */
/* A close-on-exec copy of a caller's fd, above stdio, for the child's end of
 * one standard stream: the caller's fd itself is never touched. */
static int dup_for_child(int fd)
{
    return fcntl(fd, F_DUPFD_CLOEXEC, 3);
}

int bp__spawn(struct bp_run *run)
{
    const struct bp_spec *spec = run->spec;
    int in_p[2] = {-1, -1}, out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, ep[2] = {-1, -1};
    int ctl[2] = {-1, -1}, st[2] = {-1, -1};
    int contained = spec->contain != 0;
    int stage = BP_STAGE_PIPE;

    /* The child's ends: a pipe (captured, or stdin's payload) or a copy of
     * the fd the caller gave.  A bad fd is the command's spawn failure. */
    int ok = 1;
    if (spec->stdin_fd == BP_FD_CLOSED) {
        /* the child's fd stays closed */
    } else if (spec->stdin_fd >= 0) {
        if ((in_p[0] = dup_for_child(spec->stdin_fd)) < 0) {
            ok = 0;
            stage = BP_STAGE_DUP;
        }
    } else if (make_pipe(in_p) < 0) {
        ok = 0;
    }
    if (ok && spec->stdout_fd == BP_FD_CLOSED) {
        /* the child's fd stays closed */
    } else if (ok && spec->stdout_fd >= 0) {
        if ((out_p[1] = dup_for_child(spec->stdout_fd)) < 0) {
            ok = 0;
            stage = BP_STAGE_DUP;
        }
    } else if (ok && make_pipe(out_p) < 0) {
        ok = 0;
    }
    if (ok && spec->stderr_fd == BP_FD_CLOSED) {
        /* the child's fd stays closed */
    } else if (ok && spec->stderr_fd >= 0) {
        if ((err_p[1] = dup_for_child(spec->stderr_fd)) < 0) {
            ok = 0;
            stage = BP_STAGE_DUP;
        }
    } else if (ok && !spec->merge_stderr && make_pipe(err_p) < 0) {
        ok = 0;
    }
    if (ok && ((!contained && make_pipe(ep) < 0)
               || (contained && (make_socketpair(ctl) < 0 || make_socketpair(st) < 0)))) {
        ok = 0;
        stage = BP_STAGE_PIPE;
    }
    if (!ok) {
        int e = errno;
        close_pair(in_p);
        close_pair(out_p);
        close_pair(err_p);
        close_pair(ep);
        close_pair(ctl);
        close_pair(st);
        spawn_failed(run, stage, e);
        return 0;
    }
#if defined(__linux__) && defined(F_SETPIPE_SZ)
    /* A larger pipe means fewer wakeups per megabyte; refusal is harmless. */
    if (out_p[0] >= 0)
        (void)fcntl(out_p[0], F_SETPIPE_SZ, 1 << 20);
#endif
    int err_w = spec->stderr_fd >= 0 || spec->stderr_fd == BP_FD_CLOSED || !spec->merge_stderr
                    ? err_p[1] : out_p[1];

    int fork_errno = 0;
    pid_t pid;
    if (contained) {
        char *const *envp = spec->envp != NULL ? spec->envp : environ;
        pid = bp__contain_clone(spec, envp, in_p[0], out_p[1], err_w, ctl[1], st[1],
                                &run->sup_region, &run->sup_region_len);
        fork_errno = errno;
    } else {
        struct child_ctx ctx;
        ctx.spec = spec;
        ctx.in_r = in_p[0];
        ctx.out_w = out_p[1];
        ctx.err_w = err_w;
        ctx.errpipe_w = ep[1];
        ctx.parent = getpid();
        pid = spawn_child(&ctx, &fork_errno);
    }

    bp__close_fd(&in_p[0]);
    bp__close_fd(&out_p[1]);
    bp__close_fd(&err_p[1]);
    bp__close_fd(&ep[1]);
    bp__close_fd(&ctl[1]);
    bp__close_fd(&st[1]);

    if (pid < 0) {
        close_pair(in_p);
        close_pair(out_p);
        close_pair(err_p);
        close_pair(ep);
        close_pair(ctl);
        close_pair(st);
        spawn_failed(run, BP_STAGE_FORK, fork_errno);
        return 0;
    }

    int err = 0;
    stage = 0;
    pid_t leader = pid;
    if (contained) {
        read_spawn_report(st[0], &leader, &stage, &err);
    } else {
        struct child_error ce;
        ssize_t n = read_full(ep[0], &ce, sizeof ce);
        bp__close_fd(&ep[0]);
        if (n != 0) {
            stage = n == (ssize_t)sizeof ce ? ce.stage : BP_STAGE_EXEC;
            err = n == (ssize_t)sizeof ce ? ce.err : EIO;
        }
    }

    if (stage != 0) {
        /* Nothing was started: reap our child (the supervisor exits on EOF). */
        int status;
        close_pair(ctl);
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        if (run->sup_region != NULL) {
            munmap(run->sup_region, run->sup_region_len);
            run->sup_region = NULL;
        }
        close_pair(in_p);
        close_pair(out_p);
        close_pair(err_p);
        close_pair(st);
        spawn_failed(run, stage, err);
        return 0;
    }

    run->pid = leader;
    run->res->pid = (int)leader;
    run->res->spawned = 1;
    run->stdin_fd = in_p[1];
    run->out.fd = out_p[0];
    run->err.fd = err_p[0];
    if (run->stdin_fd >= 0)
        (void)set_nonblock(run->stdin_fd);
    if (run->out.fd >= 0)
        (void)set_nonblock(run->out.fd);
    if (run->err.fd >= 0)
        (void)set_nonblock(run->err.fd);
    if (contained) {
        run->sup_pid = pid;
        run->ctl_fd = ctl[0];
        run->exit_fd = st[0];
        (void)set_nonblock(run->exit_fd);
    }
    return 0;
}
