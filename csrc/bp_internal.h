/*
 * bp_internal.h: what the C files of the core share and nobody else sees.
 */
#ifndef BP_INTERNAL_H
#define BP_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __linux__
#include <limits.h>
#include <sched.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "boundedproc.h"

#include <sys/socket.h>
#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0  /* only contained runs (Linux) send on a socket */
#endif

#ifndef BP_VERSION
#define BP_VERSION "unknown"
#endif

/* One output stream being captured. */
struct bp_stream {
    int fd;                 /* parent's read end, -1 once at EOF or closed */
    unsigned char *buf;     /* kept bytes */
    size_t len;
    size_t cap;
    uint64_t read;          /* every byte read from this stream, kept or not */
    int mapped;             /* buf came from mmap (Linux), not malloc */
    size_t lead;            /* mapped: buf - mapping start (the page offset asked for) */
    size_t populated;       /* mapped: bytes from buf already faulted in */
};

/* What keep="tail" and "head+tail" hold past the head (output.c): the last
 * bytes of both streams in one ring, in arrival order, with one bit per ring
 * byte saying which stream it came from, so memory is the tail budget plus
 * an eighth of it, however much is read. */
struct bp_tail {
    struct bp_stream ring;  /* ring.len: bytes written before it first wrapped */
    size_t wpos;            /* where the next byte goes */
    int started;            /* the first byte went in (and solo was decided) */
    int wrapped;            /* full: each byte written replaces the oldest */
    int solo;               /* BP_STDOUT/BP_STDERR: the one stream that can reach the ring
                               (bits is then NULL); 0: both can */
    uint64_t *bits;         /* bit set: that ring byte came from stderr */
    size_t nwords;
    int taken[2];           /* bp_take_output handed stdout, stderr over */
};

/* The chunk last read, for a spec with report_chunks (output.c). */
struct bp_chunk {
    int pending;            /* read, not yet returned by bp_wait as BP_CHUNK */
    int valid;              /* returned as BP_CHUNK: bp_chunk() may hand it out */
    int stream;             /* BP_STDOUT or BP_STDERR */
    int last;               /* the stream read last, so that both take turns */
    const unsigned char *ptr;
    size_t len;
};

/* Everything output.c keeps per run besides the two streams' heads. */
struct bp_output {
    struct bp_tail tail;
    struct bp_chunk chunk;
    unsigned char *scratch; /* bytes read and not kept land here: heap, never the stack */
    size_t scratch_cap;
};

/* Where the run is in its lifecycle. */
enum bp_phase {
    BP_PHASE_RUNNING = 0,   /* leader alive, no end decided */
    BP_PHASE_GRACE,         /* SIGTERM sent, waiting for kill_grace or an empty group */
    BP_PHASE_DRAIN,         /* leader reaped, reading what is left in the pipes */
    BP_PHASE_DONE
};

struct bp_run {
    struct bp_result *res;
    const struct bp_spec *spec;
    enum bp_phase phase;
    pid_t pid;
    int reaped;
    int leader_exited;      /* exit observed (pidfd or watcher), not yet reaped */
    int64_t exit_ns;        /* once leader_exited: the earliest its exit can have been.
                               Contained, when the supervisor saw it (BP_MSG_EXITED/FINAL,
                               after RUN: from start_ns here);
                               uncontained, when the loop last saw the leader alive */
    int64_t alive_seen_ns;  /* uncontained: the last poll that found the exit fd quiet */
    int exit_fd;            /* pidfd, or the watcher thread's pipe; -1: none */
    int spawn_pidfd;        /* the pidfd clone() gave an uncontained leader, until watched */
    int watch_pipe_w;       /* watcher thread's write end, -1 with pidfd */
    pthread_t watcher;
    int watcher_started;
    int stdin_fd;           /* parent's write end, -1 once closed */
    int stdin_fork_hidden;  /* stdin_fd is in the fork guard's list (spawn.c) */
    size_t stdin_off;
    struct bp_stream out;
    struct bp_stream err;
    uint64_t kept;          /* bytes kept in the heads (out.buf, err.buf) together */
    struct bp_output output;
    int64_t start_ns;
    int64_t deadline_ns;    /* < 0: none */
    int64_t grace_end_ns;
    int64_t drain_end_ns;
    int64_t drain_settle_ns; /* past drain_end, while a writer may be a killed process on its
                               way out: when to look (next) at who holds the pipes (first:
                               BP_DRAIN_SETTLE_NS after the kill; 0: never again) */
    int64_t drain_cap_ns;       /* the longest the drain waits for holders the run killed,
                                   or for pipes that nobody holds */
    int64_t drain_step_ns;      /* the step between two looks at a killed holder */
    int drain_unheld;           /* none held the pipes: their EOF is awaited, by the cap */
    int drain_to_eof;       /* every writer is gone: read what is buffered to EOF */
    int64_t next_group_check_ns;
    int64_t group_check_step_ns;
    int sigkill_sent;
    struct bp_sup *sup;     /* the containment supervisor serving this run, NULL: none */
    pid_t sup_pid;          /* its pid, 0: uncontained */
    int ctl_fd;             /* unused (kept -1) */
    int sup_dead;           /* it died (or stopped answering) during the run */
    int sup_final;          /* its FINAL report came and was taken: nothing left to ask */
    int sup_let_go;         /* silent while its leader was in the kernel's exit: let finish
                               on its own, watched by a thread (sup.c, let_sup_go) */
    int exited_status;      /* the leader's wait status from EXITED, -1: none came */
    int sup_pending;        /* RUN sent; the leader's exec (or its failure) not yet known:
                               pid may still be 0, and the supervisor signals for us */
    int64_t next_sup_check_ns; /* when to look next whether the command stopped it */
    int64_t bound_end_ns;   /* start + timeout + kill_grace + drain_grace; -1: none */
};

/* kill.c */
int bp__pidfd_exit_status(int pidfd, pid_t pid, int *status);

/* spawn.c */
int bp__spawn(struct bp_run *run);

int bp__lift_pair(int p[2]);
int bp__lift_fd(int fd);
int bp__make_pipe(int p[2]);
void bp__fork_guard(void);
void bp__fork_unguard(void);
int bp__fork_hide(int fd);
int bp__quiet_thread(pthread_t *out, size_t stack_size, int detached,
                     void *(*fn)(void *), void *arg);
void bp__fork_unhide(int fd);
int bp__set_nonblock(int fd);
void bp__spawn_failed(struct bp_run *run, int stage, int err);
#ifdef __linux__
pid_t bp__vfork_child(int (*fn)(void *), void *arg, int flags);
#endif

/* sup.c */
int bp__sup_spawn(struct bp_run *run, const int child[3], int *stage, int *err);
#define BP_ORIGIN_ALL 0  /* bp__sup_usable: compare all a child inherits */
#define BP_ORIGIN_WHO 1  /* only the ids, capabilities, no_new_privs, seccomp */
int bp__sup_usable(const struct bp_sup *sup, int what);
/* How often every wait on a supervisor looks whether the command stopped it. */
#define BP_SUP_CHECK_NS 50000000LL
/* How long after our own final kill was due a supervisor kills the run itself
 * (bp_sup_cmd.backstop_ns). */
#define BP_BACKSTOP_NS 500000000LL
/* Past drain_grace, how long a writer of the pipes may take to go (a process of
 * the group just killed, on its way out) before it counts as an escapee. */
#define BP_DRAIN_SETTLE_NS 5000000LL
/* ... and how long, at most, for pipes no process holds any more (the kernel
 * releasing the files of processes just killed): see drain_deadline, loop.c. */
#define BP_DRAIN_RELEASE_NS 500000000LL
/* ... when some processes' fd tables could not be read (not root). */
#define BP_DRAIN_PARTIAL_NS 50000000LL
/* ... and for holders the run killed when its supervisor was let go (its leader slow to
 * die: the supervisor, and the leader's children it kills once the death hands them
 * over, hold the pipes until the kernel is done with the leader). */
#define BP_DRAIN_LET_GO_NS 3000000000LL
#ifdef __linux__
/* What a child inherits from the thread that starts it and another process can
 * change from outside (prlimit, taskset, chrt or renice, ionice): the core reads
 * its calling thread's (sup.c, struct bp_origin) and the supervisor its own
 * (supervisor.c, struct inherited), each to compare with what it read before. */
struct bp_sched_state {
    struct rlimit limits[RLIM_NLIMITS];
    cpu_set_t affinity[8192 / CPU_SETSIZE];  /* the CPU mask: room for 8,192 CPUs, the
                                              * most any kernel configures (with less than
                                              * its possible CPUs the kernel refuses to
                                              * fill it) */
    uint32_t sched[14];     /* struct sched_attr (56 bytes): policy, flags, nice, priority */
    long ioprio;
};

static inline void bp__sched_state_read(struct bp_sched_state *st)
{
    memset(st, 0, sizeof *st);  /* compared with memcmp: no stale bytes */
    for (int r = 0; r < RLIM_NLIMITS; r++) {
#if defined(SYS_getrlimit) && ULONG_MAX == UINT64_MAX
        /* The old call: less than half prlimit64's cost here (no pid lookup). */
        (void)syscall(SYS_getrlimit, r, &st->limits[r]);
#else
        (void)getrlimit(r, &st->limits[r]);
#endif
    }
    (void)syscall(SYS_sched_getaffinity, 0, sizeof st->affinity, st->affinity);
#ifdef SYS_sched_getattr
    (void)syscall(SYS_sched_getattr, 0, st->sched, sizeof st->sched, 0);
#endif
#ifdef SYS_ioprio_get
    st->ioprio = syscall(SYS_ioprio_get, 1 /* IOPRIO_WHO_PROCESS */, 0);
#endif
}

int bp__proc_stat(const char *name, char *state, int *ppid, int *pgrp, unsigned *flags);
int bp__proc_exiting(char state, unsigned flags);
int bp__proc_exiting_child(pid_t pid, pid_t parent);
int bp__proc_dying(const char *name, char state, unsigned flags);
ssize_t bp__read_small(const char *path, char *buf, size_t size);
#endif
void bp__sup_revive(struct bp_sup *sup);
pid_t bp__sup_page_pid(const struct bp_run *run);
void bp__sup_signal(struct bp_run *run, int sig);
void bp__sup_event(struct bp_run *run);
int bp__sup_reap(struct bp_run *run);

/* output.c */
int bp__read_ready(struct bp_run *run, int out_ready, int err_ready);
int bp__chunk_deliver(struct bp_run *run);
void bp__chunk_release(struct bp_run *run);
void bp__output_finish(struct bp_run *run);
void bp__output_release(struct bp_run *run);

/* loop.c */
int64_t bp__now_ns(void);
void bp__close_fd(int *fd);

/* kill.c */
void bp__signal_group(struct bp_run *run, int sig);
void bp__record_unknown_status(struct bp_result *res);
void bp__let_go(struct bp_run *run);
int bp__reap(struct bp_run *run);
int bp__has_leader(const struct bp_run *run);
void bp__finish_result(struct bp_run *run);
void bp__record_status(struct bp_result *res, int status);

#endif
