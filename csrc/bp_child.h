/*
 * bp_child.h: what a freshly vforked child does before it execs the command.
 *
 * One copy of the pre-exec steps serves both ways a command starts: the
 * core's own vfork child (spawn.c, an uncontained run) and the supervisor's
 * (supervisor.c, a contained run).  Everything here runs between vfork() and
 * execve(): async-signal-safe calls only, no allocation, nothing written that
 * the parent reads but the error report.  The child shares the parent's
 * memory (CLONE_VM, or vfork()) and the parent sleeps until the child execs
 * or exits (CLONE_VFORK), so a failing child writes its report straight into
 * the parent's struct: no pipe is needed to learn why a start failed.
 * Identity changes use the
 * raw system calls: glibc's setuid() would broadcast the change to every
 * thread of the process, and a vfork child would signal the parent's threads.
 */
#ifndef BP_CHILD_H
#define BP_CHILD_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif

#include <sys/socket.h>
#include <sys/wait.h>

#ifdef __linux__
#include <sched.h>
#endif

#include "bp_internal.h"  /* boundedproc.h has no guard: only through here */
#include "bp_supervisor.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* Why a start failed: written by the child into the parent's memory. */
struct bp_child_error {
    int stage;                      /* BP_STAGE_NONE: no step failed (the exec happened) */
    int err;
};

/* Everything the child needs, prepared before the start. */
struct bp_child_args {
    char *const *exec_paths;        /* candidates for execve, NULL-terminated */
    char *const *argv;
    char *const *envp;
    const char *cwd;                /* NULL: unchanged */
    int in;                         /* the child's 0, 1, 2 (above 2), or -1: leave closed */
    int out;
    int err;
    struct bp_child_error *report;  /* the parent's: stage 0 until a step fails */
    int clean_parent;               /* the parent keeps every signal blocked and every
                                     * disposition at its default (the supervisor):
                                     * nothing to reset, nothing to block around the start */
    int new_session;
    const int64_t *rlimits_soft;    /* BP_NRLIMITS entries, < 0: unchanged */
    const int64_t *rlimits_hard;
    int64_t uid;                    /* < 0: unchanged */
    int64_t gid;
    const uint32_t *groups;         /* supplementary groups; ngroups < 0: unchanged */
    int ngroups;
    pid_t parent;                   /* die with it: exit at once if it is already gone */
    volatile int32_t *leader_slot;  /* not NULL: our pid is written there before exec (memory
                                     * the supervisor shares with the core) */
    int hello_fd;                   /* >= 0 (and no slot): send BP_MSG_LEADER there instead */
    const void *cpu_mask;           /* not NULL: take this CPU mask (cpu_mask_len bytes); the
                                     * parent runs pinned to one CPU (the supervisor) */
    size_t cpu_mask_len;
};

__attribute__((noreturn)) static inline void bp_child_fail(const struct bp_child_args *a,
                                                            int stage, int err)
{
    volatile struct bp_child_error *report = a->report;
    report->err = err;
    report->stage = stage != BP_STAGE_NONE ? stage : BP_STAGE_EXEC;
    _exit(BP_SPAWN_FAILURE_EXIT_CODE);
}

static inline int bp_child_rlimit_resource(int index)
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

static inline int bp_child_set_ids(const struct bp_child_args *a, int *stage)
{
#ifdef __linux__
    /* Becoming who we already are (a caller that is not root naming its own user) changes
     * nothing, and its groups stay as they are: setgroups() would need a privilege. */
    int same_uid = a->uid < 0 || ((uid_t)a->uid == getuid() && (uid_t)a->uid == geteuid());
    int same_gid = a->gid < 0 || ((gid_t)a->gid == getgid() && (gid_t)a->gid == getegid());
    if (same_uid && same_gid)
        return 0;
    if (a->ngroups >= 0) {
        *stage = BP_STAGE_SETGROUPS;
        if (syscall(SYS_setgroups, (size_t)a->ngroups, a->groups) < 0)
            return -1;
    }
    if (a->gid >= 0) {
        *stage = BP_STAGE_SETGID;
        if (syscall(SYS_setresgid, (gid_t)a->gid, (gid_t)a->gid, (gid_t)a->gid) < 0)
            return -1;
    }
    if (a->uid >= 0) {
        *stage = BP_STAGE_SETUID;
        if (syscall(SYS_setresuid, (uid_t)a->uid, (uid_t)a->uid, (uid_t)a->uid) < 0)
            return -1;
    }
#else
    if (a->ngroups >= 0 || a->gid >= 0 || a->uid >= 0) {
        *stage = BP_STAGE_SETUID;
        errno = ENOSYS;
        return -1;
    }
#endif
    return 0;
}

/* Try each candidate path as execvp does, except that ENOEXEC is reported
 * and never retried through /bin/sh.  Returns only on failure, with the
 * errno to report (EACCES if any candidate was not executable). */
static inline int bp_child_exec(char *const *paths, char *const *argv, char *const *envp)
{
    int saw_eacces = 0;
    int last = ENOENT;
    for (char *const *p = paths; *p != NULL; p++) {
        execve(*p, argv, envp);
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
            return e;
        }
    }
    return saw_eacces ? EACCES : last;
}

/*
 * The pre-exec steps, in order: die with the parent; every disposition back
 * to its default (Python ignores SIGPIPE, and a check must not inherit that,
 * nor an ignored SIGCHLD; a clean parent has nothing to reset, and skips the
 * 62 system calls); a new session; stdio; every other fd closed on exec;
 * limits; the CPU mask (a pinned parent's child); cwd; groups, gid, uid; the
 * signal mask emptied (the parent blocked every signal around vfork, so no
 * handler ran in the borrowed address space); exec.  Never returns.
 */
__attribute__((noreturn)) static inline void bp_child_main(const struct bp_child_args *a)
{
#ifdef __linux__
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        bp_child_fail(a, BP_STAGE_PRCTL, errno);
    if (getppid() != a->parent)
        _exit(BP_SPAWN_FAILURE_EXIT_CODE);  /* the parent is already gone */
#endif
    if (!a->clean_parent) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        for (int sig = 1; sig < NSIG; sig++) {
            if (sig == SIGKILL || sig == SIGSTOP)
                continue;
            (void)sigaction(sig, &dfl, NULL);
        }
    }
    if (a->new_session && setsid() < 0)
        bp_child_fail(a, BP_STAGE_SETSID, errno);

    int src[3] = {a->in, a->out, a->err};
    for (int fd = 0; fd < 3; fd++) {
        if (src[fd] < 0)
            (void)close(fd);
        else if (dup2(src[fd], fd) < 0)
            bp_child_fail(a, BP_STAGE_DUP, errno);
    }
#if defined(__linux__) && defined(SYS_close_range)
    if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
#endif
    {
        long max = sysconf(_SC_OPEN_MAX);
        if (max < 0 || max > (1L << 20))
            max = 1L << 20;
        for (int fd = 3; fd < (int)max; fd++)
            (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    }

    for (int i = 0; i < BP_NRLIMITS; i++) {
        if (a->rlimits_soft[i] < 0 && a->rlimits_hard[i] < 0)
            continue;
        int resource = bp_child_rlimit_resource(i);
        if (resource < 0)
            bp_child_fail(a, BP_STAGE_RLIMIT, EINVAL);
        struct rlimit rl;
        if (getrlimit(resource, &rl) < 0)
            bp_child_fail(a, BP_STAGE_RLIMIT, errno);
        if (a->rlimits_soft[i] >= 0)
            rl.rlim_cur = (rlim_t)a->rlimits_soft[i];
        if (a->rlimits_hard[i] >= 0)
            rl.rlim_max = (rlim_t)a->rlimits_hard[i];
        if (setrlimit(resource, &rl) < 0)
            bp_child_fail(a, BP_STAGE_RLIMIT, errno);
    }
#ifdef __linux__
    /* Fails only when none of those CPUs is allowed any more (a cpuset changed);
     * the command then runs where the kernel lets it, as the caller does. */
    if (a->cpu_mask != NULL)
        (void)syscall(SYS_sched_setaffinity, 0, a->cpu_mask_len, a->cpu_mask);
#endif
    if (a->cwd != NULL && chdir(a->cwd) < 0)
        bp_child_fail(a, BP_STAGE_CHDIR, errno);
    int stage = 0;
    if (bp_child_set_ids(a, &stage) < 0)
        bp_child_fail(a, stage, errno);

    sigset_t none;
    sigemptyset(&none);
    (void)sigprocmask(SIG_SETMASK, &none, NULL);
    if (a->leader_slot != NULL) {
        /* The core learns the leader's pid even if the supervisor dies
         * between our exec and its own report, and without a wakeup. */
        *a->leader_slot = (int32_t)getpid();
    } else if (a->hello_fd >= 0) {
        struct bp_sup_msg m;
        memset(&m, 0, sizeof m);
        m.type = BP_MSG_LEADER;
        m.pid = (int32_t)getpid();
        ssize_t n;
        do {
            n = send(a->hello_fd, &m, sizeof m, MSG_NOSIGNAL);
        } while (n < 0 && errno == EINTR);
    }
    bp_child_fail(a, BP_STAGE_EXEC, bp_child_exec(a->exec_paths, a->argv, a->envp));
}

/* ---- the start --------------------------------------------------------------- */

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BP_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define BP_ASAN 1
#endif
#ifdef BP_ASAN
void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#endif

#ifdef __linux__
#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000  /* Linux 5.2; C library headers may predate it */
#endif

static int bp_child_entry(void *a)
{
    bp_child_main(a);
}
#endif

/*
 * bp_child_start: start the child and wait until it has exec'd or failed.
 *
 * On Linux the child is started with clone(CLONE_VM | CLONE_VFORK) on
 * `stack` (stack_size bytes, the caller's): vfork()'s semantics, whatever a
 * sanitizer does to vfork(), plus, when pidfd is not NULL, the child's pidfd
 * (CLONE_PIDFD), made before the child can run.  A kernel before 5.2 refuses
 * CLONE_PIDFD with EINVAL: it is asked again without (*pidfd = -1), as when
 * one of the parent's fds 0..2 is closed (the pidfd would take it, and the
 * child's dup2() onto it would fail with EBUSY).  Elsewhere: vfork().
 *
 * Unless the parent is clean, every signal is blocked around the start, so
 * that no handler of the parent's runs in the lent address space; the child
 * empties its mask before exec.
 *
 * Returns the child's pid once it exec'd.  Returns -1 when it could not be
 * started (*stage BP_STAGE_FORK) or a pre-exec step failed (*stage says
 * which; the child has been reaped); *err is the errno either way.
 */
__attribute__((noinline)) static pid_t bp_child_start(const struct bp_child_args *a, void *stack,
                                                      size_t stack_size, int *pidfd, int *stage,
                                                      int *err)
{
    volatile struct bp_child_error *report = a->report;
    report->stage = BP_STAGE_NONE;
    report->err = 0;
    if (pidfd != NULL)
        *pidfd = -1;
    sigset_t all, old;
    if (!a->clean_parent) {
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
    }
    pid_t pid;
#ifdef __linux__
    char *top = (char *)stack + stack_size;
    int flags = CLONE_VM | CLONE_VFORK | SIGCHLD;
    int stdio_open = pidfd != NULL && fcntl(0, F_GETFD) >= 0 && fcntl(1, F_GETFD) >= 0
                     && fcntl(2, F_GETFD) >= 0;
    pid = -1;
    errno = EINVAL;
    if (stdio_open)
        pid = clone(bp_child_entry, top, flags | CLONE_PIDFD, (void *)a, pidfd);
    if (pid < 0 && errno == EINVAL) {
        if (pidfd != NULL)
            *pidfd = -1;
        pid = clone(bp_child_entry, top, flags, (void *)a);
    }
#else
    (void)stack;
    (void)stack_size;
    pid = vfork();
    if (pid == 0)
        bp_child_main(a);
#endif
    int fork_errno = errno;
    if (!a->clean_parent)
        pthread_sigmask(SIG_SETMASK, &old, NULL);
#ifdef BP_ASAN
    __asan_unpoison_memory_region(stack, stack_size);  /* the child's redzones */
#endif
    if (pid < 0) {
        if (pidfd != NULL)
            *pidfd = -1;
        *stage = BP_STAGE_FORK;
        *err = fork_errno;
        return -1;
    }
    if (report->stage != BP_STAGE_NONE) {
        if (pidfd != NULL && *pidfd >= 0) {
            (void)close(*pidfd);
            *pidfd = -1;
        }
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        *stage = report->stage;
        *err = report->err;
        return -1;
    }
    return pid;
}

#endif
