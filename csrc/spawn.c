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

#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/syscall.h>
#endif

extern char **environ;

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
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

/* Leave only 0, 1, 2 (and keep, which is close-on-exec) open across exec. */
static void close_other_fds(int keep)
{
#if defined(__linux__) && defined(SYS_close_range)
    /* Marking is enough: every fd above 2 then closes at the exec. */
    if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
        return;
    if (keep > 3 && syscall(SYS_close_range, 3U, (unsigned)(keep - 1), 0U) == 0
        && syscall(SYS_close_range, (unsigned)(keep + 1), ~0U, 0U) == 0)
        return;
    if (keep == 3 && syscall(SYS_close_range, 4U, ~0U, 0U) == 0)
        return;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > (1L << 20))
        max = 1L << 20;
    for (int fd = 3; fd < (int)max; fd++)
        if (fd != keep)
            close(fd);
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

    /* Python ignores SIGPIPE and may handle others: a check must start with
     * every disposition at its default.  All signals are still blocked here
     * (the parent blocked them before vfork), so no handler can run in this
     * borrowed address space meanwhile. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        (void)sigaction(sig, &dfl, NULL);
    }

    if (setsid() < 0)
        child_fail(efd, BP_STAGE_SETSID, errno);

    int err_target = spec->merge_stderr ? c->out_w : c->err_w;
    if (dup2(c->in_r, 0) < 0 || dup2(c->out_w, 1) < 0 || dup2(err_target, 2) < 0)
        child_fail(efd, BP_STAGE_DUP, errno);

    close_other_fds(efd);

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

    sigset_t none;
    sigemptyset(&none);
    (void)sigprocmask(SIG_SETMASK, &none, NULL);

    /* Try each candidate as execvp does, except that ENOEXEC is reported,
     * never retried through /bin/sh. */
    char *const *envp = spec->envp != NULL ? spec->envp : environ;
    int saw_eacces = 0;
    int last = ENOENT;
    for (char *const *p = spec->exec_paths; *p != NULL; p++) {
        execve(*p, spec->argv, envp);
        int e = errno;
        switch (e) {
        case EACCES:
            saw_eacces = 1;
            last = e;
            continue;
        case ENOENT:
        case ENOTDIR:
        case ELOOP:
        case ENAMETOOLONG:
        case ESTALE:
        case ENODEV:
        case ETIMEDOUT:
            if (!saw_eacces)
                last = e;
            continue;
        default:
            child_fail(efd, BP_STAGE_EXEC, e);
        }
    }
    child_fail(efd, BP_STAGE_EXEC, saw_eacces ? EACCES : last);
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

/*
 * bp__spawn: create the pipes and start the child.
 * Returns 0.  When the OS refuses (pipe, vfork, setsid, chdir, setrlimit or
 * execve failed), res->spawned is 0 and err_stage/err_errno say why; no fd is
 * left open and no child is left unreaped.  On success res->spawned is 1 and
 * run->pid, run->stdin_fd, run->out.fd, run->err.fd are set.
 */
int bp__spawn(struct bp_run *run)
{
    const struct bp_spec *spec = run->spec;
    int in_p[2] = {-1, -1}, out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, ep[2] = {-1, -1};

    if (make_pipe(in_p) < 0 || make_pipe(out_p) < 0
        || (!spec->merge_stderr && make_pipe(err_p) < 0) || make_pipe(ep) < 0) {
        int e = errno;
        close_pair(in_p);
        close_pair(out_p);
        close_pair(err_p);
        close_pair(ep);
        spawn_failed(run, BP_STAGE_PIPE, e);
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

    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = vfork();
    if (pid == 0)
        child_main(&ctx);
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);

    bp__close_fd(&in_p[0]);
    bp__close_fd(&out_p[1]);
    bp__close_fd(&err_p[1]);
    bp__close_fd(&ep[1]);

    if (pid < 0) {
        close_pair(in_p);
        close_pair(out_p);
        close_pair(err_p);
        close_pair(ep);
        spawn_failed(run, BP_STAGE_FORK, fork_errno);
        return 0;
    }

    struct child_error ce;
    ssize_t n;
    do {
        n = read(ep[0], &ce, sizeof ce);
    } while (n < 0 && errno == EINTR);
    bp__close_fd(&ep[0]);

    if (n != 0) {
        /* The child did not exec: it has exited or is about to.  Reap it. */
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        close_pair(in_p);
        close_pair(out_p);
        close_pair(err_p);
        if (n == (ssize_t)sizeof ce)
            spawn_failed(run, ce.stage, ce.err);
        else
            spawn_failed(run, BP_STAGE_EXEC, EIO);
        return 0;
    }

    run->pid = pid;
    run->res->pid = (int)pid;
    run->res->spawned = 1;
    run->stdin_fd = in_p[1];
    run->out.fd = out_p[0];
    run->err.fd = err_p[0];
    (void)set_nonblock(run->stdin_fd);
    (void)set_nonblock(run->out.fd);
    if (run->err.fd >= 0)
        (void)set_nonblock(run->err.fd);
    return 0;
}
