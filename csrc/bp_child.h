/*
 * bp_child.h: what a freshly started child does before it execs the command.
 *
 * One copy of the pre-exec steps serves both ways a command starts: the
 * core's own vfork-style child (spawn.c, an uncontained run) and the
 * supervisor's (supervisor.c, a contained run).  Everything here runs between
 * the clone and execve(): no allocation, no C library state, nothing written
 * that the parent reads but the error report.  The child shares the parent's
 * memory (CLONE_VM, or vfork()), so a failing child writes its report straight
 * into the parent's struct: no pipe is needed to learn why a start failed.
 *
 * Two ways to wait for it (bp_child_start):
 *   - the parent sleeps until the child execs or exits (CLONE_VFORK), and
 *     knows at once whether the start worked: the core's own starts;
 *   - the parent runs on beside it (Linux on x86_64 and aarch64, where the
 *     steps below make raw system calls): the supervisor, which then never
 *     sleeps and wakes around a leader's exec (two context switches a run),
 *     and learns a failed start from the report when the leader exits.
 *
 * Running beside its parent, the child shares its parent's thread-local
 * storage too, errno included: so on Linux every step is a raw system call
 * (bp_sys, which returns -errno and never writes errno), and identity changes
 * never go through glibc's setuid(), which would also broadcast the change to
 * every thread of the process (a vfork child would signal the parent's
 * threads).  Elsewhere (macOS) the steps use the C library, and the parent
 * always sleeps until the exec.
 */
#ifndef BP_CHILD_H
#define BP_CHILD_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
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

/* ---- the child's system calls ---------------------------------------------------- */

/* A resource limit as the steps below pass it (the kernel's struct rlimit64, which
 * prlimit64 takes on Linux). */
struct bp_k_rlimit {
    uint64_t cur, max;
};

#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
/* A child may run beside its parent (bp_child_start's wait_exec 0). */
#define BP_CHILD_BESIDE 1
/* A system call that leaves errno alone: the result, or -errno (-4095..-1). */
static inline long bp_sys(long nr, long a, long b, long c, long d, long e)
{
#if defined(__x86_64__)
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return ret;
#else
    register long x8 __asm__("x8") = nr;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    __asm__ volatile("svc 0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4)
                     : "memory", "cc");
    return x0;
#endif
}
#elif defined(__linux__)
/* Other architectures: through the C library (errno is written, so the parent
 * always waits: BP_CHILD_BESIDE is not defined). */
static inline long bp_sys(long nr, long a, long b, long c, long d, long e)
{
    long r = syscall(nr, a, b, c, d, e);
    return r == -1 ? -errno : r;
}
#endif

#ifdef __linux__
/* The 32-bit id calls where the plain ones take 16-bit ids (i386, 32-bit ARM). */
#ifdef SYS_getuid32
#define BP_NR_GETUID SYS_getuid32
#define BP_NR_GETEUID SYS_geteuid32
#define BP_NR_GETGID SYS_getgid32
#define BP_NR_GETEGID SYS_getegid32
#define BP_NR_SETGROUPS SYS_setgroups32
#define BP_NR_SETRESGID SYS_setresgid32
#define BP_NR_SETRESUID SYS_setresuid32
#else
#define BP_NR_GETUID SYS_getuid
#define BP_NR_GETEUID SYS_geteuid
#define BP_NR_GETGID SYS_getgid
#define BP_NR_GETEGID SYS_getegid
#define BP_NR_SETGROUPS SYS_setgroups
#define BP_NR_SETRESGID SYS_setresgid
#define BP_NR_SETRESUID SYS_setresuid
#endif

#define BP_SYS0(nr) bp_sys((nr), 0, 0, 0, 0, 0)
#define BP_SYS1(nr, a) bp_sys((nr), (long)(a), 0, 0, 0, 0)
#define BP_SYS2(nr, a, b) bp_sys((nr), (long)(a), (long)(b), 0, 0, 0)
#define BP_SYS3(nr, a, b, c) bp_sys((nr), (long)(a), (long)(b), (long)(c), 0, 0)
#define BP_SYS4(nr, a, b, c, d) bp_sys((nr), (long)(a), (long)(b), (long)(c), (long)(d), 0)

/* The kernel's struct sigaction (rt_sigaction). */
struct bp_k_sigaction {
    unsigned long handler, flags, restorer;
    uint64_t mask;
};

static inline long bpc_getppid(void) { return BP_SYS0(SYS_getppid); }
static inline long bpc_getpid(void) { return BP_SYS0(SYS_getpid); }
static inline long bpc_setsid(void) { return BP_SYS0(SYS_setsid); }
static inline long bpc_setpgid(pid_t pgid) { return BP_SYS2(SYS_setpgid, 0, pgid); }
static inline long bpc_close(int fd) { return BP_SYS1(SYS_close, fd); }
static inline long bpc_chdir(const char *path) { return BP_SYS1(SYS_chdir, path); }
static inline long bpc_dup2(int from, int to)
{
    /* dup3 (aarch64 has no dup2) refuses from == to: then only clear close-on-exec. */
    return from == to ? BP_SYS3(SYS_fcntl, to, F_SETFD, 0) : BP_SYS3(SYS_dup3, from, to, 0);
}
static inline long bpc_set_cloexec(int fd) { return BP_SYS3(SYS_fcntl, fd, F_SETFD, FD_CLOEXEC); }
static inline long bpc_default_action(int sig)
{
    struct bp_k_sigaction dfl = {(unsigned long)SIG_DFL, 0, 0, 0};
    return BP_SYS4(SYS_rt_sigaction, sig, &dfl, 0, sizeof dfl.mask);
}
static inline long bpc_ignore(int sig)
{
    struct bp_k_sigaction ign = {(unsigned long)SIG_IGN, 0, 0, 0};
    return BP_SYS4(SYS_rt_sigaction, sig, &ign, 0, sizeof ign.mask);
}
static inline long bpc_set_mask(uint64_t mask)  /* bit s-1: signal s */
{
    return BP_SYS4(SYS_rt_sigprocmask, SIG_SETMASK, &mask, 0, sizeof mask);
}
static inline long bpc_getrlimit(int resource, struct bp_k_rlimit *rl)
{
    return BP_SYS4(SYS_prlimit64, 0, resource, 0, rl);
}
static inline long bpc_setrlimit(int resource, const struct bp_k_rlimit *rl)
{
    return BP_SYS4(SYS_prlimit64, 0, resource, rl, 0);
}
static inline long bpc_execve(const char *path, char *const *argv, char *const *envp)
{
    return BP_SYS3(SYS_execve, path, argv, envp);
}
__attribute__((noreturn)) static inline void bpc_exit(int code)
{
    for (;;)
        (void)BP_SYS1(SYS_exit_group, code);
}
#else
static inline long bpc_ret(long r) { return r < 0 ? -errno : r; }
static inline long bpc_getppid(void) { return getppid(); }
static inline long bpc_getpid(void) { return getpid(); }
static inline long bpc_setsid(void) { return bpc_ret(setsid()); }
static inline long bpc_setpgid(pid_t pgid) { return bpc_ret(setpgid(0, pgid)); }
static inline long bpc_close(int fd) { return bpc_ret(close(fd)); }
static inline long bpc_chdir(const char *path) { return bpc_ret(chdir(path)); }
static inline long bpc_dup2(int from, int to) { return bpc_ret(dup2(from, to)); }
static inline long bpc_set_cloexec(int fd) { return bpc_ret(fcntl(fd, F_SETFD, FD_CLOEXEC)); }
static inline long bpc_default_action(int sig)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    return bpc_ret(sigaction(sig, &dfl, NULL));
}
static inline long bpc_ignore(int sig)
{
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    return bpc_ret(sigaction(sig, &ign, NULL));
}
static inline long bpc_set_mask(uint64_t mask)  /* bit s-1: signal s */
{
    sigset_t set;
    sigemptyset(&set);
    for (int sig = 1; sig < NSIG && sig <= 64; sig++) {
        if ((mask >> (sig - 1)) & 1)
            (void)sigaddset(&set, sig);
    }
    return bpc_ret(sigprocmask(SIG_SETMASK, &set, NULL));
}
static inline long bpc_getrlimit(int resource, struct bp_k_rlimit *rl)
{
    struct rlimit r;
    if (getrlimit(resource, &r) < 0)
        return -errno;
    rl->cur = (uint64_t)r.rlim_cur;
    rl->max = (uint64_t)r.rlim_max;
    return 0;
}
static inline long bpc_setrlimit(int resource, const struct bp_k_rlimit *rl)
{
    struct rlimit r = {(rlim_t)rl->cur, (rlim_t)rl->max};
    return bpc_ret(setrlimit(resource, &r));
}
static inline long bpc_execve(const char *path, char *const *argv, char *const *envp)
{
    execve(path, argv, envp);
    return -errno;
}
__attribute__((noreturn)) static inline void bpc_exit(int code) { _exit(code); }
#endif

/* Why a start failed: written by the child into the parent's memory. */
struct bp_child_error {
    int stage;                      /* BP_STAGE_NONE: no step failed (the exec happened) */
    int err;
};

/* Every disposition back to its default, through the system call on Linux: the C
 * library's sigaction() refuses its own signals (32 and 33 with glibc), which a
 * posix_spawn() from a threaded parent leaves ignored in its child. */
static inline void bpc_default_actions(void)
{
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig != SIGKILL && sig != SIGSTOP)
            (void)bpc_default_action(sig);
    }
}

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
    pid_t pgid;                     /* > 0, without new_session: join this group (the
                                     * caller's, from its supervisor's own) */
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
    uint64_t sig_ignore;            /* bit s-1: signal s ignored (after the reset) */
    uint64_t sig_mask;              /* bit s-1: signal s blocked at exec (else none) */
};

__attribute__((noreturn)) static inline void bp_child_fail(const struct bp_child_args *a,
                                                            int stage, long neg_err)
{
    volatile struct bp_child_error *report = a->report;
    report->err = (int)-neg_err;
    report->stage = stage != BP_STAGE_NONE ? stage : BP_STAGE_EXEC;
    bpc_exit(BP_SPAWN_FAILURE_EXIT_CODE);
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

/* Take the ids asked for; 0, or -errno with *stage set. */
static inline long bp_child_set_ids(const struct bp_child_args *a, int *stage)
{
#ifdef __linux__
    /* Becoming who we already are (a caller that is not root naming its own user) changes
     * nothing, and its groups stay as they are: setgroups() would need a privilege. */
    int same_uid = a->uid < 0
                   || (a->uid == BP_SYS0(BP_NR_GETUID) && a->uid == BP_SYS0(BP_NR_GETEUID));
    int same_gid = a->gid < 0
                   || (a->gid == BP_SYS0(BP_NR_GETGID) && a->gid == BP_SYS0(BP_NR_GETEGID));
    if (same_uid && same_gid)
        return 0;
    long r;
    if (a->ngroups >= 0) {
        *stage = BP_STAGE_SETGROUPS;
        if ((r = BP_SYS2(BP_NR_SETGROUPS, (size_t)a->ngroups, a->groups)) < 0)
            return r;
    }
    if (a->gid >= 0) {
        *stage = BP_STAGE_SETGID;
        if ((r = BP_SYS3(BP_NR_SETRESGID, a->gid, a->gid, a->gid)) < 0)
            return r;
    }
    if (a->uid >= 0) {
        *stage = BP_STAGE_SETUID;
        if ((r = BP_SYS3(BP_NR_SETRESUID, a->uid, a->uid, a->uid)) < 0)
            return r;
    }
#else
    if (a->ngroups >= 0 || a->gid >= 0 || a->uid >= 0) {
        *stage = BP_STAGE_SETUID;
        return -ENOSYS;
    }
#endif
    return 0;
}

/* Try each candidate path as execvp does, except that ENOEXEC is reported
 * and never retried through /bin/sh.  Returns only on failure, with the
 * -errno to report (EACCES if any candidate was not executable). */
static inline long bp_child_exec(char *const *paths, char *const *argv, char *const *envp)
{
    int saw_eacces = 0;
    long last = -ENOENT;
    for (char *const *p = paths; *p != NULL; p++) {
        long e = bpc_execve(*p, argv, envp);
        switch (-e) {
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
    return saw_eacces ? -EACCES : last;
}

/* Mark every fd from 3 up close-on-exec: close_range (Linux 5.9), else one by
 * one up to the fd limit. */
static inline void bp_child_cloexec_rest(void)
{
#if defined(__linux__) && defined(SYS_close_range)
    if (BP_SYS3(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
        return;
#endif
    struct bp_k_rlimit rl = {0, 0};
    uint64_t max = bpc_getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.cur : 0;
    if (max == 0 || max > (1U << 20))
        max = 1U << 20;
    for (int fd = 3; fd < (int)max; fd++)
        (void)bpc_set_cloexec(fd);
}

/*
 * The pre-exec steps, in order: die with the parent; every disposition back
 * to its default (Python ignores SIGPIPE, and a check must not inherit that,
 * nor an ignored SIGCHLD; a clean parent has nothing to reset, and skips the
 * 62 system calls), then SIG_IGN for those in sig_ignore; a new session;
 * stdio; every other fd closed on exec; limits; cwd; groups, gid, uid; the
 * signal mask set to sig_mask, empty unless asked (the parent blocked every
 * signal around the clone, so no handler ran in the shared address space);
 * exec.  Never returns.
 */
__attribute__((noreturn)) static inline void bp_child_main(const struct bp_child_args *a)
{
    long r;
#ifdef __linux__
    if ((r = BP_SYS2(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL)) < 0)
        bp_child_fail(a, BP_STAGE_PRCTL, r);
#endif
    if (bpc_getppid() != a->parent)
        bpc_exit(BP_SPAWN_FAILURE_EXIT_CODE);  /* the parent is already gone */
    if (!a->clean_parent)
        bpc_default_actions();
    /* What the caller asks to keep ignored (boundedproc-timeout: what it inherited). */
    for (int sig = 1; a->sig_ignore != 0 && sig < NSIG && sig <= 64; sig++) {
        if (((a->sig_ignore >> (sig - 1)) & 1) && sig != SIGKILL && sig != SIGSTOP)
            (void)bpc_ignore(sig);
    }
    if (a->new_session && (r = bpc_setsid()) < 0)
        bp_child_fail(a, BP_STAGE_SETSID, r);
    if (!a->new_session && a->pgid > 0 && (r = bpc_setpgid(a->pgid)) < 0)
        bp_child_fail(a, BP_STAGE_SETPGID, r);

    int src[3] = {a->in, a->out, a->err};
    for (int fd = 0; fd < 3; fd++) {
        if (src[fd] < 0)
            (void)bpc_close(fd);
        else if ((r = bpc_dup2(src[fd], fd)) < 0)
            bp_child_fail(a, BP_STAGE_DUP, r);
    }
    bp_child_cloexec_rest();

    for (int i = 0; i < BP_NRLIMITS; i++) {
        if (a->rlimits_soft[i] < 0 && a->rlimits_hard[i] < 0)
            continue;
        int resource = bp_child_rlimit_resource(i);
        if (resource < 0)
            bp_child_fail(a, BP_STAGE_RLIMIT, -EINVAL);
        struct bp_k_rlimit rl;
        if ((r = bpc_getrlimit(resource, &rl)) < 0)
            bp_child_fail(a, BP_STAGE_RLIMIT, r);
        if (a->rlimits_soft[i] >= 0)
            rl.cur = (uint64_t)a->rlimits_soft[i];
        if (a->rlimits_hard[i] >= 0)
            rl.max = (uint64_t)a->rlimits_hard[i];
        if ((r = bpc_setrlimit(resource, &rl)) < 0)
            bp_child_fail(a, BP_STAGE_RLIMIT, r);
    }
    if (a->cwd != NULL && (r = bpc_chdir(a->cwd)) < 0)
        bp_child_fail(a, BP_STAGE_CHDIR, r);
    int stage = 0;
    if ((r = bp_child_set_ids(a, &stage)) < 0)
        bp_child_fail(a, stage, r);
#ifdef __linux__
    if (a->uid >= 0 || a->gid >= 0) {
        /* The kernel clears the parent-death signal when the ids change: set it
         * again, or a leader whose parent died from here to its exec would run
         * on, unowned (and a start the core counts as never made could run
         * twice: _native.execute retries such a start). */
        if ((r = BP_SYS2(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL)) < 0)
            bp_child_fail(a, BP_STAGE_PRCTL, r);
        if (bpc_getppid() != a->parent)
            bpc_exit(BP_SPAWN_FAILURE_EXIT_CODE);
    }
#endif

    (void)bpc_set_mask(a->sig_mask);  /* empty, unless the caller passes on its own */
    if (a->leader_slot != NULL) {
        /* The core learns the leader's pid even if the supervisor dies
         * between our exec and its own report, and without a wakeup. */
        *a->leader_slot = (int32_t)bpc_getpid();
    }
#ifdef __linux__
    else if (a->hello_fd >= 0) {
        struct bp_sup_msg m;
        memset(&m, 0, sizeof m);
        m.type = BP_MSG_LEADER;
        m.pid = (int32_t)bpc_getpid();
        while (BP_SYS4(SYS_sendto, a->hello_fd, &m, sizeof m, MSG_NOSIGNAL) == -EINTR)
            ;
    }
#endif
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
 * bp_child_start: start the child; with wait_exec, wait until it has exec'd
 * or failed.
 *
 * On Linux the child is started with clone(CLONE_VM) on `stack` (stack_size
 * bytes, the caller's), plus, when pidfd is not NULL, the child's pidfd
 * (CLONE_PIDFD), made before the child can run.  A kernel before 5.2 refuses
 * CLONE_PIDFD with EINVAL: it is asked again without (*pidfd = -1), as when
 * one of the parent's fds 0..2 is closed (the pidfd would take it, and the
 * child's dup2() onto it would fail with EBUSY).
 *
 * wait_exec 1: CLONE_VFORK too, vfork()'s semantics whatever a sanitizer does
 * to vfork() (elsewhere: vfork() itself).  Returns the child's pid once it
 * exec'd; -1 when it could not be started (*stage BP_STAGE_FORK) or a pre-exec
 * step failed (*stage says which; the child has been reaped); *err is the
 * errno either way.
 *
 * wait_exec 0 (only where BP_CHILD_BESIDE is defined; the parent must be
 * clean): returns the child's pid at once, and the child runs beside us on our
 * memory.  Until it is reaped, *a, all it points to and the stack must stay as
 * they are, and the stack serves no other child.  A failed step shows in
 * *a->report once it exits (status BP_SPAWN_FAILURE_EXIT_CODE); a pipe whose
 * write end (close-on-exec) is open across the start reads EOF once the child
 * has exec'd or exited, which tells "about to exec" apart from "exec'd".
 *
 * Unless the parent is clean, every signal is blocked around the start, so
 * that no handler of the parent's runs in the lent address space; the child
 * empties its mask before exec.
 */
__attribute__((noinline)) static pid_t bp_child_start(const struct bp_child_args *a, void *stack,
                                                      size_t stack_size, int *pidfd,
                                                      int wait_exec, int *stage, int *err)
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
#ifdef BP_ASAN
    __asan_unpoison_memory_region(stack, stack_size);  /* an earlier child's redzones */
#endif
    pid_t pid;
#ifdef __linux__
    char *top = (char *)stack + stack_size;
    int flags = CLONE_VM | SIGCHLD;
#ifdef BP_CHILD_BESIDE
    if (wait_exec)
#endif
        flags |= CLONE_VFORK;
    /* The pidfd takes the lowest free fd, reserved in the table the child copies:
     * with one of 0..2 closed in the caller, the child's dup2() onto it would fail
     * (EBUSY).  Such a gap is filled with /dev/null for the clone's moment (the
     * child's dup2() replaces it; close-on-exec takes it from a stream the child
     * leaves closed), so that the pidfd, which a caller that ignores SIGCHLD
     * needs to learn the status of a command that exits at once, lands above
     * them.  Without /dev/null, no CLONE_PIDFD: a pidfd_open() after the start. */
    int filled[3], nfilled = 0;
    int stdio_open = pidfd != NULL;
    for (int fd = 0; stdio_open && fd < 3; fd++)
        stdio_open = fcntl(fd, F_GETFD) >= 0;
    if (pidfd != NULL && !stdio_open) {
        /* open() takes the lowest free fd: each one under 3 fills a gap, and the
         * first above them says that none is left. */
        int fd;
        while ((fd = open("/dev/null", O_RDWR | O_CLOEXEC)) >= 0 && fd <= 2)
            filled[nfilled++] = fd;
        if (fd > 2) {
            (void)close(fd);
            stdio_open = 1;
        }
    }
    pid = -1;
    errno = EINVAL;
    if (stdio_open)
        pid = clone(bp_child_entry, top, flags | CLONE_PIDFD, (void *)a, pidfd);
    if (pid < 0 && errno == EINVAL) {
        if (pidfd != NULL)
            *pidfd = -1;
        pid = clone(bp_child_entry, top, flags, (void *)a);
    }
    int clone_errno = errno;
    for (int i = 0; i < nfilled; i++)
        (void)close(filled[i]);
    errno = clone_errno;
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
    if (pid < 0) {
        if (pidfd != NULL)
            *pidfd = -1;
        *stage = BP_STAGE_FORK;
        *err = fork_errno;
        return -1;
    }
#ifdef BP_CHILD_BESIDE
    if (!wait_exec)
        return pid;  /* it runs on: nothing of its stack or report may be touched */
#else
    (void)wait_exec;
#endif
#ifdef BP_ASAN
    __asan_unpoison_memory_region(stack, stack_size);  /* the child's redzones */
#endif
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
