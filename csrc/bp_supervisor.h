/*
 * bp_supervisor.h: the wire protocol between the core and the containment
 * supervisor (contain.c), which the core clones for a contained run and
 * which starts the command.
 *
 *   core --ctl--> supervisor:  one byte per command on a socket:
 *       'T'  SIGTERM the leader's group and every adopted process
 *       'K'  SIGKILL them all, reap the leader, kill and reap every process
 *            adopted until none is left, send BP_MSG_FINAL and exit
 *       EOF  the core's process died: the same as 'K'
 *   supervisor --st--> core:  fixed-size struct bp_sup_msg records
 *       BP_MSG_SPAWNED        the leader exec'd; pid is its pid
 *       BP_MSG_SPAWN_FAILED   stage/err say why (BP_STAGE_*, errno)
 *       BP_MSG_EXITED         the leader exited (still unreaped)
 *       BP_MSG_FINAL          status/rusage of the leader, unkilled count; also
 *                             sent unasked, in place of EXITED, when the leader
 *                             exited and left nothing behind
 *
 * The supervisor is a child subreaper: whatever the leader's descendants
 * orphan (setsid, double fork, daemonising) is reparented to it, so it can
 * kill and reap them by pid, and none of their pids can be reused meanwhile.
 */
#ifndef BP_SUPERVISOR_H
#define BP_SUPERVISOR_H

#include <stdint.h>

#define BP_MSG_SPAWNED 1
#define BP_MSG_SPAWN_FAILED 2
#define BP_MSG_EXITED 3
#define BP_MSG_FINAL 4

struct bp_sup_msg {
    int32_t type;
    int32_t pid;
    int32_t stage;
    int32_t err;
    int32_t status;
    int32_t unkilled;
    int64_t utime_us;
    int64_t stime_us;
    int64_t maxrss_kb;
};

#endif
