/*
 * spawn.c: give the child its stdio and start it.
 *
 * An uncontained run is started here, vfork-style: the parent's address
 * space is never copied (it is lent to the child until execve() or _exit()),
 * so the cost of a spawn does not grow with the caller's memory.  A contained
 * run is handed to the run's supervisor (sup.c), which starts the command
 * with the same pre-exec steps (bp_child.h).
 */
#include "bp_internal.h"
#include "bp_child.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef __APPLE__
/* A shared library cannot link against `environ` on macOS. */
#include <crt_externs.h>
#define environ (*_NSGetEnviron())
#else
extern char **environ;
#endif

/* Move a new fd to 3 or above so that dup2() onto 0..2 in the child never
 * clobbers another of our fds (the caller may have closed its stdio); on
 * failure it is closed: -1, errno set. */
int bp__lift_fd(int fd)
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
int bp__lift_pair(int p[2])
{
    p[0] = bp__lift_fd(p[0]);
    p[1] = bp__lift_fd(p[1]);
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

/*
 * The fork guard.  Close-on-exec keeps a run's pipes out of every exec'd
 * program, but not out of a child another thread fork()s and that does not
 * exec (a multiprocessing "fork" worker): one forked while a run's pipes are
 * being set up keeps the child's ends (the run's stdout then never reaches
 * EOF: `escaped`) or the stdin's write end (a `cat` never sees EOF: 124) for
 * as long as it lives.  So the few microseconds from a run's first pipe to the
 * close of the child's ends (and of a stdin whose payload the pipe took) are
 * held as readers of a lock that fork() takes as writer (pthread_atfork:
 * os.fork() waits for the runs being set up; vfork, clone and posix_spawn
 * run no fork handlers, so no spawn of ours ever waits on it).  Writers
 * first, so that runs starting back to back on many threads never keep a
 * fork waiting.  As Go's syscall.ForkLock.  A run's stdin whose payload is
 * still being written is hidden from the fork's child (below); the read ends we
 * keep stay a fork's to copy (a read end held elsewhere keeps no EOF away).
 */
static pthread_rwlock_t fork_guard;

/*
 * The stdin write ends a fork must not keep: a payload larger than the pipe is
 * written by the loop as the command reads, long after the guard let go, and a
 * child forked meanwhile would hold the write end (the command then never sees
 * EOF).  Such a run lists its write end here (bp__fork_hide) for as long as it
 * is open; the fork's child handler points each listed fd at /dev/null (the
 * pipe's write end is gone from the child, yet its fd number stays taken there,
 * so no later close of it in the child hits another file).  The list is
 * changed only with the guard held as reader, so a fork sees it whole; its
 * mutex is for the readers among themselves.  Runs with nothing left to write
 * after the start (almost all) never touch it.
 */
#define HIDDEN_MAX 256
static int hidden[HIDDEN_MAX];  /* fd + 1; 0: a free slot */
static pthread_mutex_t hidden_lock = PTHREAD_MUTEX_INITIALIZER;

static void hidden_in_child(void)
{
    int null_fd = -1;
    for (int i = 0; i < HIDDEN_MAX; i++) {
        if (hidden[i] == 0)
            continue;
        int fd = hidden[i] - 1;
        hidden[i] = 0;
        if (null_fd < 0)
            null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (null_fd < 0 || dup2(null_fd, fd) < 0)
            (void)close(fd);  /* no /dev/null: closed, its number free again */
        else
            (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    if (null_fd >= 0)
        (void)close(null_fd);
    pthread_mutex_init(&hidden_lock, NULL);
}
static pthread_once_t fork_guard_once = PTHREAD_ONCE_INIT;
static int fork_guard_ok;

static void fork_guard_prepare(void)
{
    pthread_rwlock_wrlock(&fork_guard);
}

static void fork_guard_parent(void)
{
    pthread_rwlock_unlock(&fork_guard);
}

/* The lock, made (again): writers first. */
static int fork_guard_make(void)
{
    pthread_rwlockattr_t attr;
    if (pthread_rwlockattr_init(&attr) != 0)
        return 0;
#ifdef __GLIBC__  /* an enum constant, not a macro: glibc's own */
    (void)pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    int ok = pthread_rwlock_init(&fork_guard, &attr) == 0;
    (void)pthread_rwlockattr_destroy(&attr);
    return ok;
}

/* In the child the lock is made anew, never unlocked: glibc knows its writer by
 * thread id, which the child's one thread does not share with the forking one
 * (an unlock there is taken for a reader's, and the lock stays held for good). */
static void fork_guard_child(void)
{
    fork_guard_ok = fork_guard_make();
    hidden_in_child();
}

static void fork_guard_init(void)
{
    fork_guard_ok = fork_guard_make()
                    && pthread_atfork(fork_guard_prepare, fork_guard_parent,
                                      fork_guard_child) == 0;
}

void bp__fork_guard(void)
{
    (void)pthread_once(&fork_guard_once, fork_guard_init);
    if (fork_guard_ok)
        pthread_rwlock_rdlock(&fork_guard);
}

void bp__fork_unguard(void)
{
    if (fork_guard_ok)
        pthread_rwlock_unlock(&fork_guard);
}

/* List fd (with the guard held): 1 if listed, 0 if not (no guard, list full). */
int bp__fork_hide(int fd)
{
    if (!fork_guard_ok || fd < 0)
        return 0;
    int listed = 0;
    pthread_mutex_lock(&hidden_lock);
    for (int i = 0; i < HIDDEN_MAX && !listed; i++)
        if (hidden[i] == 0) {
            hidden[i] = fd + 1;
            listed = 1;
        }
    pthread_mutex_unlock(&hidden_lock);
    return listed;
}

/* Take fd off the list (with the guard held, before it is closed). */
void bp__fork_unhide(int fd)
{
    pthread_mutex_lock(&hidden_lock);
    for (int i = 0; i < HIDDEN_MAX; i++)
        if (hidden[i] == fd + 1) {
            hidden[i] = 0;
            break;
        }
    pthread_mutex_unlock(&hidden_lock);
}

/* Start fn(arg) on a thread born with every signal blocked, so that the
 * caller's handlers run in its own threads (the calling thread's mask is as it
 * was on return); stack_size 0: the default.  Returns 0 or pthread_create's
 * error. */
int bp__quiet_thread(pthread_t *out, size_t stack_size, int detached,
                     void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_attr_t attr;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        if (stack_size > 0)
            (void)pthread_attr_setstacksize(&attr, stack_size);
        if (detached)
            (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(out, &attr, fn, arg);
        pthread_attr_destroy(&attr);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* A close-on-exec pipe, both ends above stdio. */
int bp__make_pipe(int p[2])
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
    return bp__lift_pair(p);
}

/* Our end of a fresh pipe has no status flag but its access mode, which
 * F_SETFL ignores: no F_GETFL needed. */
int bp__set_nonblock(int fd)
{
    return fcntl(fd, F_SETFL, O_NONBLOCK);
}

/* The child's stack (Linux: it runs on a stack of its own, see bp_child_start). */
#define CHILD_STACK_SIZE (64 * 1024)

#ifdef __linux__
/*
 * One child stack per calling thread, mapped at its first start of a child (an
 * uncontained leader, or a supervisor: sup.c) and unmapped when the thread
 * exits (a thread starts one child at a time: the start is one call, with
 * every signal blocked around the clone).  A
 * mapping made and unmapped at every start costs two system calls, page
 * faults on the fresh pages, and an unmap while the child may still be
 * switching off this address space on another CPU (a TLB shootdown there).
 * After fork() the child keeps the forking thread's stack (its copy) and
 * never sees the other threads' again (64 KiB each, for the child's life).
 */
static pthread_key_t stack_key;
static pthread_once_t stack_once = PTHREAD_ONCE_INIT;
static int stack_key_ok;
static __thread void *thread_stack;

static void stack_release(void *stack)
{
    (void)munmap(stack, CHILD_STACK_SIZE);
}

static void stack_key_init(void)
{
    stack_key_ok = pthread_key_create(&stack_key, stack_release) == 0;
}

/* This thread's child stack, or NULL with errno when none can be mapped. *kept is 0
 * when the caller must unmap it after the start (no key to release it at thread exit). */
static void *child_stack(int *kept)
{
    *kept = 1;
    if (thread_stack != NULL)
        return thread_stack;
    void *stack = mmap(NULL, CHILD_STACK_SIZE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED)
        return NULL;
    (void)pthread_once(&stack_once, stack_key_init);
    if (stack_key_ok && pthread_setspecific(stack_key, stack) == 0)
        thread_stack = stack;
    else
        *kept = 0;
    return stack;
}

/* bp__vfork_child: start fn(arg) as a vfork-style child (CLONE_VM | CLONE_VFORK |
 * flags) on this thread's child stack, with every signal blocked around the clone;
 * we resume once it has exec'd or exited.  Returns its pid, or -1 with errno.  The
 * supervisor's start (sup.c); a leader starts through bp_child_start. */
pid_t bp__vfork_child(int (*fn)(void *), void *arg, int flags)
{
    int kept;
    void *stack = child_stack(&kept);
    if (stack == NULL)
        return -1;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = clone(fn, (char *)stack + CHILD_STACK_SIZE, CLONE_VM | CLONE_VFORK | SIGCHLD | flags,
                      arg);
    int err = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
#ifdef BP_ASAN
    __asan_unpoison_memory_region(stack, CHILD_STACK_SIZE);  /* the child's redzones */
#endif
    if (!kept)
        (void)munmap(stack, CHILD_STACK_SIZE);
    errno = err;
    return pid;
}
#endif

void bp__spawn_failed(struct bp_run *run, int stage, int err)
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

/* A close-on-exec copy of a caller's fd, above stdio, for the child's end of
 * one standard stream: the caller's fd itself is never touched. */
static int dup_for_child(int fd)
{
    return fcntl(fd, F_DUPFD_CLOEXEC, 3);
}

/* The child's end of one stream into child[i] and, for a pipe, our end into
 * ours (-1 otherwise).  Returns 0, or -1 with errno and *stage set. */
static int stream_end(int given, int want_pipe, int is_input, int *child, int *ours, int *stage)
{
    *child = *ours = -1;
    if (given == BP_FD_CLOSED || (given < 0 && !want_pipe))
        return 0;
    if (given >= 0) {
        *stage = BP_STAGE_DUP;
        return (*child = dup_for_child(given)) < 0 ? -1 : 0;
    }
    int p[2];
    *stage = BP_STAGE_PIPE;
    if (bp__make_pipe(p) < 0)
        return -1;
    *child = is_input ? p[0] : p[1];
    *ours = is_input ? p[1] : p[0];
    return 0;
}

/* The stdio could not be set up: close what was made, report, return 0. */
static int stdio_failed(struct bp_run *run, int child[3], int ours[3], int stage, int err)
{
    for (int i = 0; i < 3; i++) {
        bp__close_fd(&child[i]);
        bp__close_fd(&ours[i]);
    }
    bp__spawn_failed(run, stage, err);
    return 0;
}

/* An uncontained start, here.  The child's pidfd is asked for at the start
 * (CLONE_PIDFD): its exit status can then be read from it (PIDFD_INFO_EXIT,
 * kill.c) even when the kernel reaped the child at once (the caller ignores
 * SIGCHLD) or a SIGCHLD handler of the caller's took it with waitpid(-1); a
 * pidfd_open() after the start comes too late for a command that exits at
 * once. */
static pid_t start_here(struct bp_run *run, const int child[3], int *stage, int *err)
{
    const struct bp_spec *spec = run->spec;
    struct bp_child_error report;
    struct bp_child_args a;
    memset(&a, 0, sizeof a);
    a.exec_paths = spec->exec_paths;
    a.argv = spec->argv;
    a.envp = spec->envp != NULL ? spec->envp : environ;
    a.cwd = spec->cwd;
    a.in = child[0];
    a.out = child[1];
    a.err = child[2];
    a.report = &report;
    a.new_session = spec->new_session;
    a.rlimits_soft = spec->rlimits_soft;
    a.rlimits_hard = spec->rlimits_hard;
    a.uid = spec->uid;
    a.gid = spec->gid;
    a.groups = spec->groups;
    a.ngroups = spec->ngroups;
    a.sig_ignore = spec->sig_ignore;
    a.sig_mask = spec->sig_mask;
    a.parent = getpid();
    a.hello_fd = -1;
    void *stack = NULL;
#ifdef __linux__
    int kept;
    stack = child_stack(&kept);
    if (stack == NULL) {
        *stage = BP_STAGE_FORK;
        *err = errno;
        return -1;
    }
#endif
    int pidfd = -1;
    pid_t pid = bp_child_start(&a, stack, CHILD_STACK_SIZE, &pidfd, 1, stage, err);
#ifdef __linux__
    if (!kept)
        (void)munmap(stack, CHILD_STACK_SIZE);
#endif
    if (pid > 0)
        run->spawn_pidfd = pidfd;
    return pid;
}

/* Write what of the stdin payload the pipe takes now, before the child
 * exists (its read end is still ours, so no EPIPE): a payload the pipe can
 * hold is then delivered whether or not the command reads it before it exits,
 * never at the mercy of which of the two runs first.  The rest, if any, is
 * written by the loop as the command reads. */
static void prefill_stdin(struct bp_run *run, int fd)
{
    const struct bp_spec *spec = run->spec;
    if (fd < 0 || spec->stdin_len == 0 || bp__set_nonblock(fd) < 0)
        return;
    while (run->stdin_off < spec->stdin_len) {
        ssize_t n = write(fd, spec->stdin_data + run->stdin_off, spec->stdin_len - run->stdin_off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;  /* full (EAGAIN): the loop goes on from here */
        run->stdin_off += (size_t)n;
    }
    run->res->stdin_written = run->stdin_off;
}

/*
 * bp__spawn: set up the child's stdio and start it, here (uncontained) or
 * through run->sup (contained).
 * Returns 0.  When the OS refused (pipe, vfork, setsid, chdir, setrlimit,
 * setuid, execve, ...), res->spawned is 0 and err_stage/err_errno say why; no
 * fd is left open and no child unreaped.  On success res->spawned is 1 and
 * run->pid (the leader), run->stdin_fd, run->out.fd, run->err.fd are set.
 * A contained start only hands the command to the supervisor: run->pid is 0
 * (run->sup_pending) until it is known, and a failure of the leader's setup
 * or exec is learned by the loop, which then undoes res->spawned (sup.c).
 */
int bp__spawn(struct bp_run *run)
{
    const struct bp_spec *spec = run->spec;
    int child[3] = {-1, -1, -1}, ours[3] = {-1, -1, -1};
    int stage = 0;
    int merged = spec->merge_stderr && spec->stderr_fd == -1;
    const int given[3] = {spec->stdin_fd, spec->stdout_fd, spec->stderr_fd};
    const int want_pipe[3] = {1, 1, !merged};
    /* The caller's own fds are copied before we make any fd of our own: a fd
     * the caller closed would otherwise be refused only after a pipe of ours
     * took its number, and the child would get that pipe in its place. */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 3; i++) {
            if ((given[i] >= 0) != (pass == 0))
                continue;
            if (stream_end(given[i], want_pipe[i], i == 0, &child[i], &ours[i], &stage) < 0)
                return stdio_failed(run, child, ours, stage, errno);
        }
    }
    if (merged && child[1] >= 0 && (child[2] = dup_for_child(child[1])) < 0)
        return stdio_failed(run, child, ours, BP_STAGE_DUP, errno);
#if defined(__linux__) && defined(F_SETPIPE_SZ)
    /* A larger pipe means fewer wakeups per megabyte; refusal is harmless. */
    if (ours[1] >= 0)
        (void)fcntl(ours[1], F_SETPIPE_SZ, 1 << 20);
#endif

    prefill_stdin(run, ours[0]);

    int err = 0;
    pid_t pid = 0;
    int started;
    if (run->sup != NULL)
        started = bp__sup_spawn(run, child, &stage, &err) == 0;  /* the leader's pid comes later */
    else
        started = (pid = start_here(run, child, &stage, &err)) > 0;
    for (int i = 0; i < 3; i++)
        bp__close_fd(&child[i]);

    if (!started) {
        for (int i = 0; i < 3; i++)
            bp__close_fd(&ours[i]);
        run->stdin_off = 0;  /* what the pipe took reached no command */
        run->res->stdin_written = 0;
        if (!run->res->spawned)
            bp__spawn_failed(run, stage, err);
        return 0;
    }
    run->pid = pid;
    run->res->pid = (int)pid;
    run->res->spawned = 1;
    run->stdin_fd = ours[0];
    run->out.fd = ours[1];
    run->err.fd = ours[2];
    for (int i = 0; i < 3; i++)
        if (ours[i] >= 0 && !(i == 0 && spec->stdin_len == 0))  /* that one is closed at once */
            (void)bp__set_nonblock(ours[i]);
    return 0;
}
