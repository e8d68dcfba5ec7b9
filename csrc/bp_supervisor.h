/*
 * bp_supervisor.h: the wire protocol between the core (sup.c) and the
 * containment supervisor program (supervisor.c).
 *
 * One SOCK_SEQPACKET socket pair per supervisor; the supervisor's end is its
 * fd 3.  Every message is one record.
 *
 *   core -> supervisor
 *     BP_CMD_RUN     struct bp_sup_cmd, with SCM_RIGHTS: the spec memfd (see
 *                    below) and the child's stdin, stdout, stderr ends (the
 *                    ones the command gets as 0, 1, 2; a stream whose bit is
 *                    set in `closed` is left closed in the child, no fd sent)
 *     BP_CMD_SIGNAL  send `sig` to the leader's group (the leader alone with
 *                    new_session 0) and to every adopted orphan
 *     BP_CMD_KILL    SIGKILL all of it, reap the leader, kill and reap every
 *                    adopted process until none is left or `budget_ns` is
 *                    spent, answer BP_MSG_FINAL, and wait for the next run
 *     EOF            the core let go (or its process died): as KILL, then exit
 *
 *   supervisor -> core (struct bp_sup_msg)
 *     BP_MSG_HELLO        at start: err 0, or the stage/errno that refused it;
 *                         status: BP_SUP_PROTOCOL, which the core checks, so that
 *                         a core and a supervisor program of different builds
 *                         (a package upgraded under a running process, a stale
 *                         build beside a fresh one) never serve a run together
 *     BP_MSG_LEADER       sent by the leader itself just before its exec: pid
 *                         (only when the supervisor has no shared page, below)
 *     BP_MSG_SPAWNED      the leader exec'd: pid (only without a shared page:
 *                         with one, FINAL or EXITED says the exec worked)
 *     BP_MSG_SPAWN_FAILED stage/err say why; nothing is running, and a KILL
 *                         or SIGNAL that crossed it is ignored (no FINAL)
 *     BP_MSG_EXITED       the leader exited (still unreaped): pid, and status,
 *                         its wait status as peeked; kept by the core for a
 *                         supervisor that dies before FINAL (SPEC 9.2); exit_after_ns,
 *                         when (the core may read it late, past its deadline)
 *     BP_MSG_FINAL        the leader's status; rusage summed over every process
 *                         reaped during the run (max_rss: the largest);
 *                         unkilled: adopted processes left alive.  Also sent
 *                         unasked, in place of EXITED, when the leader exited
 *                         and left nothing behind.  `reusable` 0: the
 *                         supervisor exits after it (something is left).
 *
 * The CPU: a supervisor runs on the CPU mask of the thread that started it,
 * which its leaders inherit (sup.c replaces a thread's own supervisor when
 * that mask changes; a run_many worker's lives for one call, as batch.c
 * says), and the kernel places it.  The core never pins it: pinned to one
 * CPU, it sat on whatever else kept that CPU busy, and each command it
 * started waited there (benchmarks/README.md, "Never pinned").
 *
 * The shared page: a memfd of one page, the supervisor's fd 4 at its start
 * (BP_SUP_PAGE_FD), mapped shared by the core and the supervisor, and so by
 * the leader, which runs on the supervisor's memory until its exec.  Its
 * first int32 is the current run's leader pid: the core zeroes it before
 * RUN, and the leader writes its pid there just before its exec.  If the
 * supervisor dies before the run's end, the core still knows which group to
 * kill, and no message wakes it for the start: the core does not wait for
 * one (bp_start returns as soon as RUN is sent).  Without the page (it could
 * not be made), the leader sends BP_MSG_LEADER and the supervisor SPAWNED.
 *
 * The supervisor holds the child's stdout and stderr ends (copies) from RUN
 * until just after FINAL: the core sees the pipes' EOF, and FINAL, at one
 * wakeup at the run's end instead of two.
 *
 * A spec of at most BP_SPEC_INLINE_MAX bytes travels in the RUN record itself,
 * after the header; a larger one in a memfd.  Either holds, back to back: cwd (if has_cwd), argv, envp and the
 * exec candidates as NUL-terminated strings, then ngroups uint32_t groups.
 */
#ifndef BP_SUPERVISOR_H
#define BP_SUPERVISOR_H

#include <stdint.h>

#define BP_CMD_RUN 1
#define BP_CMD_SIGNAL 2
#define BP_CMD_KILL 3

/* This protocol's version, in HELLO's status (0 in every build before it was sent). */
#define BP_SUP_PROTOCOL 0x62700008

#define BP_MSG_HELLO 1
#define BP_MSG_LEADER 2
#define BP_MSG_SPAWNED 3
#define BP_MSG_SPAWN_FAILED 4
#define BP_MSG_EXITED 5
#define BP_MSG_FINAL 6

#define BP_SPEC_INLINE_MAX (48 * 1024)

/* The supervisor's end of the socket, in the supervisor. */
#define BP_SUP_FD 3
/* The shared page's memfd, in the supervisor at its start (if there is one). */
#define BP_SUP_PAGE_FD 4
#define BP_SUP_PAGE_SIZE 4096

struct bp_sup_cmd {
    int32_t type;
    int32_t sig;            /* BP_CMD_SIGNAL */
    int64_t budget_ns;      /* BP_CMD_KILL */
    /* BP_CMD_RUN */
    int32_t closed;         /* bit i: the child's fd i stays closed (no fd passed) */
    int32_t new_session;
    int32_t has_cwd;
    int32_t argc;
    int32_t envc;
    int32_t npaths;
    int32_t ngroups;        /* < 0: unchanged */
    int32_t pgid;           /* > 0 (new_session 0): the group the leader joins, the
                               caller's; the supervisor has one of its own */
    int64_t uid;
    int64_t gid;
    int64_t spec_len;       /* bytes of the spec: after this header in the same record
                               when inline, else in the memfd */
    int32_t inline_spec;    /* 1: the spec follows the header; no memfd is passed */
    int32_t pad2;
    int64_t rlimits_soft[5];
    int64_t rlimits_hard[5];
    int64_t backstop_ns;    /* > 0: from the leader's start, when the supervisor kills
                               the run itself if no KILL came (the core's deadline plus
                               kill_grace plus a margin: a caller stopped or blocked
                               cannot keep its command past its bound); 0: never */
    uint64_t sig_ignore;    /* bp_spec's: ignored in the leader, and its mask at exec */
    uint64_t sig_mask;
};

struct bp_sup_msg {
    int32_t type;
    int32_t pid;
    int32_t stage;
    int32_t err;
    int32_t status;
    int32_t unkilled;
    int32_t reusable;
    int32_t backstop;       /* FINAL: the run was killed at backstop_ns, its leader
                               still running: the deadline's doing */
    int64_t utime_us;
    int64_t stime_us;
    int64_t maxrss_kb;
    int64_t exit_after_ns;  /* EXITED, FINAL: when the leader's exit was seen, in ns
                               after RUN came (>= 1; a duration, as a caller in another
                               time namespace has another CLOCK_MONOTONIC); 0: it did
                               not exit on its own (killed at KILL or the backstop) */
};

#endif
