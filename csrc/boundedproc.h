/*
 * boundedproc.h: the public interface of the C core.
 *
 * This file is read twice: by the C compiler (through bp_internal.h) and by
 * cffi's cdef (csrc/build_ffi.py).  cdef understands only declarations and
 * integer #defines, so this header holds nothing else: no include guards, no
 * #include, no function-like macros.  Types are limited to those cffi knows
 * natively (int, int64_t, uint64_t, size_t, double, char pointers).
 *
 * Lifecycle of one run:
 *   bp_start()  validates nothing (Python did), spawns the child and returns a
 *               run handle, or 0 with res->spawned == 0 when the OS refused.
 *   bp_wait()   drives the poll loop; returns BP_AGAIN when a signal or the
 *               wake fd interrupted it, so the caller can run its handlers and
 *               call again, BP_DONE when the run is over and reaped.  With
 *               spec->report_chunks it also returns BP_CHUNK after each read
 *               that produced bytes: bp_chunk() then gives that chunk, valid
 *               until the next bp_wait() call, and the caller calls again.
 *   bp_abort()  ends the run at once (group SIGKILL, reap), for a caller that
 *               is unwinding.  Idempotent, safe after BP_DONE.
 *   bp_take_output() copies one stream's kept bytes into caller memory and
 *               releases the core's copy as it goes.
 *   bp_free()   releases the handle; calls bp_abort() first if needed.
 *
 * Many runs on the core's own threads (batch.c): bp_batch_new(), then
 * bp_batch_submit() a spec and its result with a tag, bp_batch_next() for the
 * runs that are over (up to n at once, any order; 0 without wait, or when the
 * wake fd or a signal interrupted the wait; a run with output to take is the
 * caller's to bp_free()), and bp_batch_free() once done.
 */

/* Exit codes reported for runs the runner ended (see SPEC 2.4). */
#define BP_DEADLINE_EXIT_CODE 124
#define BP_CANCEL_EXIT_CODE 137
#define BP_OVERFLOW_EXIT_CODE 137
#define BP_SPAWN_FAILURE_EXIT_CODE 127
#define BP_CANNOT_EXECUTE_EXIT_CODE 126

/* bp_wait() return values (besides -1). */
#define BP_DONE 0
#define BP_AGAIN 1
#define BP_CHUNK 2                /* a chunk was read: see bp_chunk() */

/* Why the run ended. */
#define BP_END_NONE 0
#define BP_END_EXIT 1
#define BP_END_DEADLINE 2
#define BP_END_CANCEL 3
#define BP_END_OVERFLOW 4
#define BP_END_ABORT 5

/* The stage that failed, stored beside errno in bp_result.err_stage. */
#define BP_STAGE_NONE 0
#define BP_STAGE_PIPE 1
#define BP_STAGE_FORK 2
#define BP_STAGE_SETSID 3
#define BP_STAGE_DUP 4
#define BP_STAGE_CHDIR 5
#define BP_STAGE_RLIMIT 6
#define BP_STAGE_EXEC 7
#define BP_STAGE_ALLOC 8
#define BP_STAGE_POLL 9
#define BP_STAGE_READ 10
#define BP_STAGE_WRITE 11
#define BP_STAGE_WAIT 12
#define BP_STAGE_KILL 13
#define BP_STAGE_PIDFD 14
#define BP_STAGE_THREAD 15
#define BP_STAGE_PRCTL 16
#define BP_STAGE_SUPERVISOR 17
#define BP_STAGE_SETGROUPS 18
#define BP_STAGE_SETGID 19
#define BP_STAGE_SETUID 20
#define BP_STAGE_MEMFD 21
#define BP_STAGE_SETPGID 22

/* bp_result.runner_failed: what happened to the supervisor of a run. */
#define BP_RUNNER_OK 0
#define BP_RUNNER_DIED 1        /* it exited or was killed during the run */
#define BP_RUNNER_UNRESPONSIVE 2 /* it did not answer in time (stopped?) and was killed */

/* bp_spec.stdin_fd/stdout_fd/stderr_fd: the child gets that fd closed
 * (the caller's own was closed and it asked to pass it on). */
#define BP_FD_CLOSED -4

/* What max_output keeps; bp_spec.keep. */
#define BP_KEEP_HEAD 0
#define BP_KEEP_TAIL 1
#define BP_KEEP_HEAD_TAIL 2

/* Streams for bp_take_output(). */
#define BP_STDOUT 1
#define BP_STDERR 2

/* Indices into bp_spec.rlimits; a value < 0 leaves that limit alone. */
#define BP_RLIMIT_CPU 0
#define BP_RLIMIT_AS 1
#define BP_RLIMIT_NPROC 2
#define BP_RLIMIT_FSIZE 3
#define BP_RLIMIT_NOFILE 4
#define BP_NRLIMITS 5

/* How the leader's exit is watched; bp_spec.exit_watch. */
#define BP_WATCH_AUTO 0
#define BP_WATCH_PIDFD 1
#define BP_WATCH_THREAD 2
#define BP_WATCH_SUPERVISOR 3

struct bp_spec {
    char *const *exec_paths;      /* NULL-terminated candidates for execve, tried in order */
    char *const *argv;            /* NULL-terminated argument vector */
    char *const *envp;            /* NULL-terminated, the child's whole environment; NULL: the caller's */
    const char *cwd;              /* NULL: the caller's */
    const unsigned char *stdin_data; /* payload, may be NULL when stdin_len == 0 */
    size_t stdin_len;
    int64_t timeout_ns;           /* < 0: no deadline */
    int64_t max_output;           /* < 0: no cap; counts stdout and stderr together */
    int overflow_kill;            /* past the cap: 0 discard and go on, 1 kill the group */
    int keep;                     /* BP_KEEP_*: which bytes the cap keeps */
    int report_chunks;            /* 1: bp_wait returns BP_CHUNK after each read with bytes */
    int merge_stderr;             /* child's stderr is its stdout pipe */
    int cancel_fd;                /* readable means cancelled; -1: none */
    int cancel_fd2;               /* a second one, boundedproc's own (an awaiting task's, an
                                     early-closed run_many's), whose caller wants no result:
                                     it also ends a drain at once; -1: none */
    int wake_fd;                  /* readable means return BP_AGAIN; -1: none */
    int64_t kill_grace_ns;        /* first_signal, then SIGKILL after this; 0: SIGKILL at once;
                                     < 0: never SIGKILL before the leader exits */
    int first_signal;             /* sent when the run ends and kill_grace_ns != 0 (SIGTERM) */
    int new_session;              /* 1: the leader setsid()s and the group is signalled;
                                     0: it stays in our group and only it is signalled */
    int stdin_fd;                 /* -1: a pipe carrying stdin_data; else the child's fd 0 */
    int stdout_fd;                /* -1: captured through a pipe; else the child's fd 1 */
    int stderr_fd;                /* -1: captured (stdout's pipe with merge_stderr); else fd 2 */
    int64_t drain_grace_ns;       /* after the reap, read pipes at most this long */
    int exit_watch;               /* BP_WATCH_*: AUTO picks pidfd where the kernel has it */
    int contain;                  /* 1: start the command under the containment supervisor */
    size_t out_page_offset;       /* where in a page the caller's output buffers will start;
                                     a hint that lets bp_take_output move pages, not copy */
    int64_t rlimits_soft[5];      /* BP_NRLIMITS entries, < 0: unchanged */
    int64_t rlimits_hard[5];
    int64_t uid;                  /* setresuid before exec; < 0: unchanged */
    int64_t gid;                  /* setresgid before exec; < 0: unchanged */
    const uint32_t *groups;       /* setgroups before exec ... */
    int ngroups;                  /* ... of this many; < 0: unchanged */
    uint64_t sig_ignore;          /* bit s-1: signal s is ignored in the child (SIG_IGN kept
                                     across exec); 0: every disposition at its default */
    uint64_t sig_mask;            /* bit s-1: signal s is blocked in the child at its exec;
                                     0: the mask empty (boundedproc-timeout passes on what
                                     it inherited, as coreutils' timeout does) */
};

struct bp_result {
    int spawned;                  /* the child exec'd */
    int pid;                      /* the leader's pid, 0 when not spawned */
    int exit_code;                /* per SPEC 2.4 */
    int term_signal;              /* signal that ended the leader, 0: none */
    int end_reason;               /* BP_END_* */
    int timed_out;
    int cancelled;
    int output_truncated;
    int escaped;
    int stdin_delivered;
    int err_stage;                /* BP_STAGE_* of the first failure, 0: none */
    int err_errno;                /* errno saved at that failure */
    uint64_t output_bytes;        /* all bytes read, kept and discarded */
    uint64_t stdin_written;
    uint64_t stdout_len;          /* kept bytes, available to bp_take_output after BP_DONE */
    uint64_t stderr_len;
    double user_time;
    double system_time;
    int64_t max_rss;              /* bytes */
    int exit_watch;               /* BP_WATCH_* actually used */
    int unkilled;                 /* contained run: adopted processes that could not be killed */
    uint64_t stdout_read;         /* bytes read from each stream, kept or not */
    uint64_t stderr_read;
    int runner_failed;            /* BP_RUNNER_*: the supervisor failed the run; 0: it did not */
    int runner_status;            /* its wait status when it was reaped, -1: unknown */
    int raw_exit_code;            /* the leader's own status (exit code, or 128 + signal),
                                     before the rules of SPEC 2.4 replace it; -1: unknown */
    int64_t stdout_gap;           /* index in the kept bytes where omitted ones were; -1: none */
    int64_t stderr_gap;
};

struct bp_run;
struct bp_sup;
struct bp_batch;

/* bp_batch_done.rc: how a batch's run ended (batch.c). */
#define BP_BATCH_DONE 0           /* ran to BP_DONE: see bp_batch_done.run */
#define BP_BATCH_FAILED 1         /* bp_wait failed (res err_stage/err_errno); ended, freed */
#define BP_BATCH_NO_HANDLE 2      /* bp_start could not allocate the run: nothing spawned */
#define BP_BATCH_NO_SUPERVISOR 3  /* bp_sup_start failed at stage with err: nothing spawned */
#define BP_BATCH_CANCELLED 4      /* a cancel fd was readable at its turn: nothing spawned */

struct bp_batch_done {
    int64_t tag;                  /* the caller's, from bp_batch_submit */
    struct bp_run *run;           /* BP_BATCH_DONE with output to take: the caller takes it
                                     and frees the run; else NULL (freed by the worker) */
    int rc;                       /* BP_BATCH_* */
    int stage;                    /* BP_BATCH_NO_SUPERVISOR: bp_sup_start's stage ... */
    int err;                      /* ... and errno */
    int sup_pid;                  /* the supervisor that ran it; 0: none */
    int64_t start_ns;             /* CLOCK_MONOTONIC when a worker took it ... */
    int64_t end_ns;               /* ... and when it was over */
};

const char *bp_version(void);
int bp_start(const struct bp_spec *spec, struct bp_result *res, struct bp_sup *sup,
             struct bp_run **out);
int bp_wait(struct bp_run *run);
int bp_signal(struct bp_run *run, int sig);
int bp_run_pid(struct bp_run *run);
void bp_abort(struct bp_run *run);
int bp_take_output(struct bp_run *run, int stream, unsigned char *dest, size_t len);
int bp_chunk(struct bp_run *run, int *stream, const unsigned char **ptr, size_t *len);
void bp_free(struct bp_run *run);
int bp_group_alive(int pgid);
int bp_contain_supported(void);
int bp_sup_start(const char *path, char *const *envp, struct bp_sup **out, int *stage);
int bp_sup_usable(const struct bp_sup *sup);
int bp_sup_reusable(const struct bp_sup *sup);
int bp_sup_pid(const struct bp_sup *sup);
void bp_sup_free(struct bp_sup *sup);
void bp_sup_forget(struct bp_sup *sup);
int bp_batch_new(int jobs, const char *sup_path, char *const *sup_envp, struct bp_batch **out);
int bp_jobs_within_fd_limit(int jobs);
int bp_batch_submit(struct bp_batch *b, const struct bp_spec *spec, struct bp_result *res,
                    int64_t tag);
int bp_batch_next(struct bp_batch *b, int wake_fd, int wait, struct bp_batch_done *out, int n);
void bp_batch_free(struct bp_batch *b);
void bp_batch_forget(struct bp_batch *b);
void bp_batch_release_parked(void);
