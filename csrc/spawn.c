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
#include <sys/socket.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif

extern char **environ;


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
    char *const *sup_argv;  /* NULL: exec the command itself */
    int ctl_fd;             /* supervisor's ends of the ctl and st sockets */
    int st_fd;
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

/* Runs in the vfork child: set up and exec, or report why not and _exit.
 * With a supervisor, the program exec'd is the supervisor, which starts the
 * command itself (it keeps the ctl and st sockets across the exec). */
__attribute__((noreturn, noinline)) static void child_main(const struct child_ctx *c)
{
    const struct bp_spec *spec = c->spec;
    int efd = c->errpipe_w;

    /* All signals are still blocked here (the parent blocked them before
     * vfork), so no handler can run in this borrowed address space. */
    bp_child_default_signals();

    if (setsid() < 0)
        child_fail(efd, BP_STAGE_SETSID, errno);

    int err_target = spec->merge_stderr ? c->out_w : c->err_w;
    if (dup2(c->in_r, 0) < 0 || dup2(c->out_w, 1) < 0 || dup2(err_target, 2) < 0)
        child_fail(efd, BP_STAGE_DUP, errno);

    int keep[3] = {efd, c->ctl_fd, c->st_fd};
    bp_child_close_fds(keep, c->sup_argv != NULL ? 3 : 1);
    if (c->sup_argv != NULL
        && (fcntl(c->ctl_fd, F_SETFD, 0) < 0 || fcntl(c->st_fd, F_SETFD, 0) < 0))
        child_fail(efd, BP_STAGE_SUPERVISOR, errno);

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
    if (c->sup_argv != NULL) {
        /* The supervisor empties the mask itself once SIGCHLD is routed. */
        execve(c->sup_argv[0], c->sup_argv, envp);
        child_fail(efd, BP_STAGE_SUPERVISOR, errno);
    }

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

/* Build the supervisor's argv:
 *   SUP CTL_FD ST_FD NCAND CAND... -- ARGV...
 * Returns a malloc'd vector (strings in one block after it) or NULL. */
static char **supervisor_argv(const struct bp_spec *spec, int ctl_fd, int st_fd)
{
    size_t ncand = 0, nargs = 0, bytes = 0;
    for (char *const *p = spec->exec_paths; *p != NULL; p++, ncand++)
        bytes += strlen(*p) + 1;
    for (char *const *p = spec->argv; *p != NULL; p++, nargs++)
        bytes += strlen(*p) + 1;
    size_t slots = 5 + ncand + 1 + nargs + 1;
    bytes += strlen(spec->supervisor) + 1 + 3 * 24;
    char **v = malloc(slots * sizeof *v + bytes);
    if (v == NULL)
        return NULL;
    char *s = (char *)(v + slots);
    size_t i = 0;
#define PUT(str)                         \
    do {                                 \
        size_t l_ = strlen(str) + 1;     \
        memcpy(s, (str), l_);            \
        v[i++] = s;                      \
        s += l_;                         \
    } while (0)
    char num[24];
    PUT(spec->supervisor);
    snprintf(num, sizeof num, "%d", ctl_fd);
    PUT(num);
    snprintf(num, sizeof num, "%d", st_fd);
    PUT(num);
    snprintf(num, sizeof num, "%zu", ncand);
    PUT(num);
    for (char *const *p = spec->exec_paths; *p != NULL; p++)
        PUT(*p);
    PUT("--");
    for (char *const *p = spec->argv; *p != NULL; p++)
        PUT(*p);
#undef PUT
    v[i] = NULL;
    return v;
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

/*
 * bp__spawn: create the pipes and start the child (or, for a contained run,
 * the supervisor that starts it).
 * Returns 0.  When the OS refuses (pipe, vfork, setsid, chdir, setrlimit,
 * execve, or the supervisor failed), res->spawned is 0 and err_stage/err_errno
 * say why; no fd is left open and no child is left unreaped.  On success
 * res->spawned is 1 and run->pid (the leader), run->stdin_fd, run->out.fd,
 * run->err.fd are set; for a contained run also run->sup_pid, run->ctl_fd and
 * run->exit_fd (the supervisor's status socket).
 */
int bp__spawn(struct bp_run *run)
{
    const struct bp_spec *spec = run->spec;
    int in_p[2] = {-1, -1}, out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, ep[2] = {-1, -1};
    int ctl[2] = {-1, -1}, st[2] = {-1, -1};
    char **sup_argv = NULL;
    int contained = spec->supervisor != NULL;

    if (make_pipe(in_p) < 0 || make_pipe(out_p) < 0
        || (!spec->merge_stderr && make_pipe(err_p) < 0) || make_pipe(ep) < 0
        || (contained && (make_socketpair(ctl) < 0 || make_socketpair(st) < 0))) {
        int e = errno;
        close_pair(in_p);
        close_pair(out_p);
        close_pair(err_p);
        close_pair(ep);
        close_pair(ctl);
        close_pair(st);
        spawn_failed(run, BP_STAGE_PIPE, e);
        return 0;
    }
    if (contained && (sup_argv = supervisor_argv(spec, ctl[1], st[1])) == NULL) {
        close_pair(in_p);
        close_pair(out_p);
        close_pair(err_p);
        close_pair(ep);
        close_pair(ctl);
        close_pair(st);
        spawn_failed(run, BP_STAGE_ALLOC, ENOMEM);
        return 0;
    }
#if defined(__linux__) && defined(F_SETPIPE_SZ)
    /* A larger pipe means fewer wakeups per megabyte; refusal is harmless. */
    (void)fcntl(out_p[0], F_SETPIPE_SZ, 1 << 20);
#endif

    struct child_ctx ctx;
    ctx.spec = spec;
    ctx.in_r = in_p[0];
    ctx.out_w = out_p[1];
    ctx.err_w = spec->merge_stderr ? out_p[1] : err_p[1];
    ctx.errpipe_w = ep[1];
    ctx.sup_argv = sup_argv;
    ctx.ctl_fd = ctl[1];
    ctx.st_fd = st[1];
    ctx.parent = getpid();

    int fork_errno = 0;
    pid_t pid = spawn_child(&ctx, &fork_errno);
    free(sup_argv);

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

    struct child_error ce;
    ssize_t n = read_full(ep[0], &ce, sizeof ce);
    bp__close_fd(&ep[0]);

    int stage = 0, err = 0;
    pid_t leader = pid;
    if (n != 0) {
        stage = n == (ssize_t)sizeof ce ? ce.stage : BP_STAGE_EXEC;
        err = n == (ssize_t)sizeof ce ? ce.err : EIO;
    } else if (contained) {
        /* The supervisor runs; it reports the leader's spawn next. */
        struct bp_sup_msg m;
        n = read_full(st[0], &m, sizeof m);
        if (n == (ssize_t)sizeof m && m.type == BP_MSG_SPAWNED) {
            leader = m.pid;
        } else if (n == (ssize_t)sizeof m && m.type == BP_MSG_SPAWN_FAILED) {
            stage = m.stage;
            err = m.err;
        } else {
            stage = BP_STAGE_SUPERVISOR;
            err = EIO;
        }
    }

    if (stage != 0) {
        /* Nothing was started (or the supervisor gives up): reap our child. */
        int status;
        close_pair(ctl);  /* EOF tells a live supervisor to clean up and exit */
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
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
    (void)set_nonblock(run->stdin_fd);
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
