/*
 * loop.c: the run handle and its poll loop.
 *
 * One thread, one poll(): the stdout and stderr pipes, the stdin pipe while a
 * payload remains, the cancel fd, the caller's wake fd, and the leader's exit
 * (a pidfd, or the pipe of a watcher thread where the kernel has no pidfd).
 * poll() sleeps until one of them is ready or the next deadline of the
 * current phase passes; nothing is polled on a timer while the run is
 * healthy, and no SIGCHLD handler is installed.
 */
#include "bp_internal.h"
#include "bp_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/mman.h>
#include <sys/syscall.h>
#endif

#define READ_CHUNK ((size_t)1 << 16)
#define MAP_THRESHOLD ((size_t)1 << 20)
#define READS_PER_WAKE 32
#define PREFAULT_WINDOW ((size_t)1 << 20)
#ifndef MADV_POPULATE_WRITE
#define BP_MADV_POPULATE_WRITE 23
#else
#define BP_MADV_POPULATE_WRITE MADV_POPULATE_WRITE
#endif

int64_t bp__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + (int64_t)ts.tv_nsec;
}

void bp__close_fd(int *fd)
{
    if (*fd >= 0) {
        int saved = errno;
        close(*fd);
        errno = saved;
        *fd = -1;
    }
}

const char *bp_version(void)
{
    return BP_VERSION;
}

#if defined(__linux__) && defined(SYS_pidfd_open)
static int pidfd_open_(pid_t pid)
{
    return (int)syscall(SYS_pidfd_open, pid, 0);
}
#endif

/* ---- output buffers ---------------------------------------------------- */

static size_t page_size(void)
{
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 4096;
}

static void stream_release(struct bp_stream *s)
{
    if (s->buf != NULL) {
#ifdef __linux__
        if (s->mapped)
            munmap(s->buf - s->lead, s->cap + s->lead);
        else
#endif
            free(s->buf);
    }
    s->buf = NULL;
    s->len = s->cap = 0;
    s->mapped = 0;
    s->lead = 0;
    s->populated = 0;
}

/* Make room for at least `need` bytes in total, never more than `limit`.
 * Large buffers are anonymous mappings grown with mremap: no copy on growth,
 * and only pages that were written count towards resident memory. */
static int stream_reserve(struct bp_stream *s, size_t need, size_t limit, size_t lead)
{
    if (need <= s->cap)
        return 0;
    size_t ncap = s->cap ? s->cap : READ_CHUNK;
    while (ncap < need)
        ncap = ncap > SIZE_MAX / 2 ? SIZE_MAX : ncap * 2;
    if (ncap > limit)
        ncap = limit;
    if (ncap < need)
        ncap = need;
#ifdef __linux__
    if (ncap >= MAP_THRESHOLD) {
        size_t pg = page_size();
        /* The kept bytes start `lead` bytes into the mapping, at the page
         * offset the caller's destination will have, so that bp_take_output
         * can hand whole pages over with mremap instead of copying them. */
        if (!s->mapped)
            s->lead = lead % pg;
        size_t maplen = (s->lead + ncap + pg - 1) / pg * pg;
        unsigned char *p;
        if (s->mapped) {
            p = mremap(s->buf - s->lead, s->cap + s->lead, maplen, MREMAP_MAYMOVE);
        } else {
            p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p != MAP_FAILED && s->len > 0)
                memcpy(p + s->lead, s->buf, s->len);
            if (p != MAP_FAILED)
                free(s->buf);
        }
        if (p == MAP_FAILED)
            return -1;
        s->buf = p + s->lead;
        s->cap = maplen - s->lead;
        s->mapped = 1;
        return 0;
    }
#endif
    void *p = realloc(s->buf, ncap);
    if (p == NULL)
        return -1;
    s->buf = p;
    s->cap = ncap;
    return 0;
}

/* ---- ending the run ---------------------------------------------------- */

static void close_stdin(struct bp_run *run)
{
    bp__close_fd(&run->stdin_fd);
}

static void enter_drain(struct bp_run *run)
{
    run->phase = BP_PHASE_DRAIN;
    int64_t g = run->spec->drain_grace_ns;
    run->drain_end_ns = bp__now_ns() + (g > 0 ? g : 0);
}

/* SIGKILL the group, reap the leader, start draining. */
static int kill_and_reap(struct bp_run *run)
{
    bp__signal_group(run, SIGKILL);
    int rc = bp__reap(run);
    enter_drain(run);
    return rc;
}

/* Decide why the run ends and start ending it. */
static int end_run(struct bp_run *run, int reason)
{
    if (run->res->end_reason == BP_END_NONE)
        run->res->end_reason = reason;
    close_stdin(run);
    if (reason == BP_END_OVERFLOW || run->spec->kill_grace_ns <= 0)
        return kill_and_reap(run);
    bp__signal_group(run, SIGTERM);
    run->phase = BP_PHASE_GRACE;
    int64_t now = bp__now_ns();
    run->grace_end_ns = now + run->spec->kill_grace_ns;
    run->group_check_step_ns = 1000000;  /* 1 ms, doubling to 50 ms */
    run->next_group_check_ns = now;
    return 0;
}

static void finish(struct bp_run *run)
{
    bp__close_fd(&run->out.fd);
    bp__close_fd(&run->err.fd);
    close_stdin(run);
    bp__close_fd(&run->exit_fd);
    bp__close_fd(&run->watch_pipe_w);
    bp__close_fd(&run->ctl_fd);
    bp__finish_result(run);
    run->phase = BP_PHASE_DONE;
}

/* ---- I/O ---------------------------------------------------------------- */

/* Read what is ready on one stream.  Returns 0, or -1 on allocation failure.
 * Bytes within the combined cap are kept in arrival order; bytes past it are
 * read into a stack buffer and dropped, so the child never blocks on a full
 * pipe and the caller's memory stays bounded. */
static int read_stream(struct bp_run *run, struct bp_stream *s)
{
    const struct bp_spec *spec = run->spec;
    struct bp_result *res = run->res;
    unsigned char scratch[READ_CHUNK];
    for (int i = 0; i < READS_PER_WAKE && s->fd >= 0; i++) {
        size_t room = SIZE_MAX;
        if (spec->max_output >= 0) {
            uint64_t cap = (uint64_t)spec->max_output;
            room = run->kept >= cap ? 0 : (size_t)(cap - run->kept);
        }
        unsigned char *dst;
        size_t want;
        if (room > 0) {
            size_t need = s->len + (room < READ_CHUNK ? room : READ_CHUNK);
            size_t limit = room > SIZE_MAX - s->len ? SIZE_MAX : s->len + room;
            if (stream_reserve(s, need, limit, spec->out_page_offset) < 0) {
                res->err_stage = BP_STAGE_ALLOC;
                res->err_errno = ENOMEM;
                errno = ENOMEM;
                return -1;
            }
            dst = s->buf + s->len;
            want = s->cap - s->len;
            if (want > room)
                want = room;
        } else {
            dst = scratch;
            want = sizeof scratch;
        }
#if defined(__linux__)
        /* Fault the next pages in before read(), not inside it: a read that
         * faults does so holding the pipe's lock, and the writer spins on
         * that lock instead of refilling the pipe meanwhile.  At most one
         * window is faulted ahead of what is kept, so RSS tracks the output. */
        if (room > 0 && s->mapped) {
            if (want > PREFAULT_WINDOW)
                want = PREFAULT_WINDOW;
            if (s->len + want > s->populated && s->populated < s->cap) {
                size_t pg = page_size();
                size_t from = s->populated > s->len ? s->populated : s->len;
                size_t span = s->cap - from < PREFAULT_WINDOW ? s->cap - from : PREFAULT_WINDOW;
                uintptr_t lo = ((uintptr_t)(s->buf + from)) & ~(uintptr_t)(pg - 1);
                uintptr_t hi = (uintptr_t)(s->buf + from + span);
                if (madvise((void *)lo, (size_t)(hi - lo), BP_MADV_POPULATE_WRITE) == 0)
                    s->populated = from + span;
                else
                    s->populated = s->cap;  /* unsupported (before 5.14): let read fault */
            }
        }
#endif
        ssize_t n = read(s->fd, dst, want);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            bp__close_fd(&s->fd);  /* EIO and the like: nothing more will come */
            return 0;
        }
        if (n == 0) {
            bp__close_fd(&s->fd);
            return 0;
        }
        res->output_bytes += (uint64_t)n;
        if (room > 0) {
            s->len += (size_t)n;
            run->kept += (uint64_t)n;
        } else {
            res->output_truncated = 1;
            if (spec->overflow_kill && run->phase == BP_PHASE_RUNNING)
                return 0;  /* the caller ends the run */
        }
        if ((size_t)n < want)
            return 0;  /* the pipe is empty for now */
    }
    return 0;
}

static void write_stdin(struct bp_run *run)
{
    const struct bp_spec *spec = run->spec;
    while (run->stdin_fd >= 0 && run->stdin_off < spec->stdin_len) {
        size_t left = spec->stdin_len - run->stdin_off;
        ssize_t n = write(run->stdin_fd, spec->stdin_data + run->stdin_off, left);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            /* EPIPE: the child closed its stdin; the rest is not delivered. */
            close_stdin(run);
            return;
        }
        run->stdin_off += (size_t)n;
        run->res->stdin_written = run->stdin_off;
    }
    if (run->stdin_off >= spec->stdin_len) {
        run->res->stdin_delivered = 1;
        close_stdin(run);
    }
}

/* ---- the exit watcher thread, for kernels without pidfd ----------------- */

static void *watcher_main(void *p)
{
    struct bp_run *run = p;
    siginfo_t info;
    /* WNOWAIT: learn of the exit without reaping, so the leader stays a
     * zombie and the group id stays ours until bp__reap(). */
    while (waitid(P_PID, (id_t)run->pid, &info, WEXITED | WNOWAIT) < 0 && errno == EINTR)
        ;
    ssize_t n;
    do {
        n = write(run->watch_pipe_w, "x", 1);
    } while (n < 0 && errno == EINTR);
    return NULL;
}

static int start_exit_watch(struct bp_run *run)
{
    int mode = run->spec->exit_watch;
    if (run->sup_pid > 0) {
        run->res->exit_watch = BP_WATCH_SUPERVISOR;  /* its status socket is exit_fd */
        return 0;
    }
#if defined(__linux__) && defined(SYS_pidfd_open)
    if (mode == BP_WATCH_AUTO || mode == BP_WATCH_PIDFD) {
        int fd = pidfd_open_(run->pid);
        if (fd >= 0) {
            run->exit_fd = fd;
            run->res->exit_watch = BP_WATCH_PIDFD;
            return 0;
        }
        if (mode == BP_WATCH_PIDFD) {
            run->res->err_stage = BP_STAGE_PIDFD;
            run->res->err_errno = errno;
            return -1;
        }
    }
#endif
    int p[2];
    if (pipe(p) < 0) {
        run->res->err_stage = BP_STAGE_PIPE;
        run->res->err_errno = errno;
        return -1;
    }
    (void)fcntl(p[0], F_SETFD, FD_CLOEXEC);
    (void)fcntl(p[1], F_SETFD, FD_CLOEXEC);
    run->exit_fd = p[0];
    run->watch_pipe_w = p[1];
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  /* the watcher takes no signals */
    int rc = pthread_create(&run->watcher, NULL, watcher_main, run);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        run->res->err_stage = BP_STAGE_THREAD;
        run->res->err_errno = rc;
        return -1;
    }
    run->watcher_started = 1;
    run->res->exit_watch = BP_WATCH_THREAD;
    return 0;
}

/* The exit fd is readable: a pidfd (the leader exited), the watcher's pipe,
 * or the supervisor's status socket (BP_MSG_EXITED, or EOF if it died). */
static void note_exit_event(struct bp_run *run)
{
    if (run->sup_pid <= 0) {
        run->leader_exited = 1;
        return;
    }
    struct bp_sup_msg m;
    ssize_t n;
    do {
        n = recv(run->exit_fd, &m, sizeof m, MSG_PEEK);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    if (n == (ssize_t)sizeof m && m.type == BP_MSG_EXITED)
        (void)recv(run->exit_fd, &m, sizeof m, 0);
    /* EXITED; FINAL (the supervisor finished on its own once the leader
     * was alone: left unread for the reap); or EOF: the supervisor is gone. */
    run->leader_exited = 1;
}

/* ---- public entry points ------------------------------------------------ */

/*
 * bp_start: spawn spec's command and return its handle in *out.
 * Returns 0 with *out set, also when the OS refused the spawn (then
 * res->spawned == 0, res->err_stage/err_errno say why, res->exit_code is 126
 * or 127, and the handle is already done).  Returns -1 with errno ENOMEM and
 * *out NULL only when the handle itself cannot be allocated.  res is zeroed
 * first and written by every later call on the handle; it and spec must stay
 * valid until bp_free().
 */
int bp_start(const struct bp_spec *spec, struct bp_result *res, struct bp_run **out)
{
    *out = NULL;
    memset(res, 0, sizeof *res);
    struct bp_run *run = calloc(1, sizeof *run);
    if (run == NULL) {
        res->err_stage = BP_STAGE_ALLOC;
        res->err_errno = ENOMEM;
        errno = ENOMEM;
        return -1;
    }
    run->res = res;
    run->spec = spec;
    run->exit_fd = run->watch_pipe_w = run->stdin_fd = run->ctl_fd = -1;
    run->out.fd = run->err.fd = -1;
    run->deadline_ns = -1;
    res->stdin_delivered = spec->stdin_len == 0;
    *out = run;

    bp__spawn(run);
    if (!res->spawned) {
        run->phase = BP_PHASE_DONE;
        return 0;
    }
    run->start_ns = bp__now_ns();
    if (spec->timeout_ns >= 0)
        run->deadline_ns = run->start_ns + spec->timeout_ns;
    if (spec->stdin_len == 0)
        close_stdin(run);

    if (start_exit_watch(run) < 0) {
        /* Started but unwatchable: end it at once rather than run blind. */
        int stage = res->err_stage, err = res->err_errno;
        res->end_reason = BP_END_ABORT;
        kill_and_reap(run);
        finish(run);
        res->err_stage = stage;
        res->err_errno = err;
        return 0;
    }
    return 0;
}

static int ms_until(int64_t now, int64_t when)
{
    if (when < 0)
        return -1;
    if (when <= now)
        return 0;
    int64_t ms = (when - now + 999999) / 1000000;
    return ms > 1000000000 ? 1000000000 : (int)ms;
}

/*
 * bp_wait: drive the run until it is over.
 * Returns BP_DONE once the leader is reaped, the pipes are drained (or
 * abandoned at drain_grace, setting res->escaped) and res is complete.
 * Returns BP_AGAIN when poll() was interrupted by a signal or the wake fd is
 * readable; the caller handles that and calls bp_wait() again.  Returns -1
 * with errno set and res->err_stage/err_errno filled on an internal failure
 * (poll error, allocation failure); the run has then been killed and reaped.
 */
int bp_wait(struct bp_run *run)
{
    const struct bp_spec *spec = run->spec;
    struct bp_result *res = run->res;
    struct pollfd fds[7];
    enum { S_OUT, S_ERR, S_IN, S_EXIT, S_CANCEL, S_CANCEL2, S_WAKE, S_N };
    int idx[S_N];

    for (;;) {
        if (run->phase == BP_PHASE_DONE)
            return BP_DONE;
        int64_t now = bp__now_ns();
        int64_t wake_at = -1;

        if (run->phase == BP_PHASE_RUNNING) {
            if (run->leader_exited) {
                end_run(run, BP_END_EXIT);
                continue;
            }
            if (run->deadline_ns >= 0 && now >= run->deadline_ns) {
                end_run(run, BP_END_DEADLINE);
                continue;
            }
            wake_at = run->deadline_ns;
        } else if (run->phase == BP_PHASE_GRACE) {
            int empty = 0;
            if (run->leader_exited && now >= run->next_group_check_ns) {
                empty = !bp_group_alive((int)run->pid);
                run->next_group_check_ns = now + run->group_check_step_ns;
                if (run->group_check_step_ns < 50000000)
                    run->group_check_step_ns *= 2;
            }
            if (empty || now >= run->grace_end_ns) {
                kill_and_reap(run);
                continue;
            }
            wake_at = run->grace_end_ns;
            if (run->leader_exited && run->next_group_check_ns < wake_at)
                wake_at = run->next_group_check_ns;
        } else {  /* DRAIN */
            if (run->out.fd < 0 && run->err.fd < 0) {
                finish(run);
                return BP_DONE;
            }
            if (now >= run->drain_end_ns) {
                res->escaped = 1;
                finish(run);
                return BP_DONE;
            }
            wake_at = run->drain_end_ns;
        }

        int n = 0;
        for (int i = 0; i < S_N; i++)
            idx[i] = -1;
#define ADD(slot, fdv, ev)                  \
    do {                                    \
        if ((fdv) >= 0) {                   \
            fds[n].fd = (fdv);              \
            fds[n].events = (ev);           \
            fds[n].revents = 0;             \
            idx[slot] = n++;                \
        }                                   \
    } while (0)
        ADD(S_OUT, run->out.fd, POLLIN);
        ADD(S_ERR, run->err.fd, POLLIN);
        if (run->phase == BP_PHASE_RUNNING)
            ADD(S_IN, run->stdin_fd, POLLOUT);
        if (!run->leader_exited && !run->reaped)
            ADD(S_EXIT, run->exit_fd, POLLIN);
        if (run->phase == BP_PHASE_RUNNING) {
            ADD(S_CANCEL, spec->cancel_fd, POLLIN);
            ADD(S_CANCEL2, spec->cancel_fd2, POLLIN);
        }
        ADD(S_WAKE, spec->wake_fd, POLLIN);
#undef ADD

        int rc = poll(fds, (nfds_t)n, ms_until(now, wake_at));
        if (rc < 0) {
            if (errno == EINTR)
                return BP_AGAIN;
            int e = errno;
            res->err_stage = BP_STAGE_POLL;
            res->err_errno = e;
            bp_abort(run);
            errno = e;
            return -1;
        }
        if (rc == 0)
            continue;

        if (idx[S_OUT] >= 0 && fds[idx[S_OUT]].revents != 0 && read_stream(run, &run->out) < 0)
            goto internal_error;
        if (idx[S_ERR] >= 0 && fds[idx[S_ERR]].revents != 0 && read_stream(run, &run->err) < 0)
            goto internal_error;
        if (spec->overflow_kill && res->output_truncated && run->phase == BP_PHASE_RUNNING) {
            end_run(run, BP_END_OVERFLOW);
            continue;
        }
        if (idx[S_IN] >= 0 && fds[idx[S_IN]].revents != 0)
            write_stdin(run);
        if (idx[S_EXIT] >= 0 && fds[idx[S_EXIT]].revents != 0)
            note_exit_event(run);
        int cancel_ready = (idx[S_CANCEL] >= 0 && fds[idx[S_CANCEL]].revents != 0)
                           || (idx[S_CANCEL2] >= 0 && fds[idx[S_CANCEL2]].revents != 0);
        if (cancel_ready && run->phase == BP_PHASE_RUNNING && !run->leader_exited) {
            end_run(run, BP_END_CANCEL);
            continue;
        }
        if (idx[S_WAKE] >= 0 && fds[idx[S_WAKE]].revents != 0)
            return BP_AGAIN;
    }

internal_error: {
        int e = errno;
        bp_abort(run);
        errno = e;
        return -1;
    }
}

/*
 * bp_abort: end the run now: SIGKILL the group (while the leader is
 * unreaped), reap the leader, close every fd.  Sets end_reason to
 * BP_END_ABORT if no other reason was decided.  Idempotent; never fails.
 */
void bp_abort(struct bp_run *run)
{
    if (run == NULL || run->phase == BP_PHASE_DONE)
        return;
    if (run->res->end_reason == BP_END_NONE)
        run->res->end_reason = BP_END_ABORT;
    bp__signal_group(run, SIGKILL);
    (void)bp__reap(run);
    finish(run);
}

/*
 * bp_take_output: copy the kept bytes of stream (BP_STDOUT or BP_STDERR) to
 * dest, which holds exactly len bytes (res->stdout_len or res->stderr_len),
 * releasing the core's memory as the copy goes so that the two copies never
 * both sit in memory whole.  Returns 0, or -1 with errno EINVAL when stream
 * or len is wrong.  Afterwards the stream's kept length is 0.
 */
int bp_take_output(struct bp_run *run, int stream, unsigned char *dest, size_t len)
{
    struct bp_stream *s = stream == BP_STDOUT ? &run->out : stream == BP_STDERR ? &run->err : NULL;
    if (s == NULL || len != s->len) {
        errno = EINVAL;
        return -1;
    }
#ifdef __linux__
    /* Zero-copy handoff: when the destination sits at the same page offset
     * as the kept bytes, copy the partial first and last pages and move the
     * whole pages in between into place with mremap.  Only pages that lie
     * entirely inside [dest, dest + len) are replaced, so memory around the
     * destination is never touched.  Any refusal falls back to copying. */
    size_t pg = page_size();
    if (s->mapped && len >= MAP_THRESHOLD
        && ((uintptr_t)dest & (pg - 1)) == ((uintptr_t)s->buf & (pg - 1))) {
        uintptr_t d0 = (uintptr_t)dest, d1 = d0 + len;
        uintptr_t a = (d0 + pg - 1) & ~(uintptr_t)(pg - 1);
        uintptr_t b = d1 & ~(uintptr_t)(pg - 1);
        if (b > a) {
            size_t head = a - d0, mid = b - a;
            void *r = mremap(s->buf + head, mid, mid, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)a);
            if (r != MAP_FAILED) {
                memcpy(dest, s->buf, head);
                memcpy((void *)b, s->buf + head + mid, d1 - b);
                /* Unmap what is left of ours, never the hole mremap made
                 * (another mapping may already live there). */
                unsigned char *base = s->buf - s->lead;
                size_t maplen = s->cap + s->lead;
                unsigned char *hole = s->buf + head;
                munmap(base, (size_t)(hole - base));
                if (hole + mid < base + maplen)
                    munmap(hole + mid, (size_t)(base + maplen - (hole + mid)));
                s->buf = NULL;
                s->len = s->cap = 0;
                s->mapped = 0;
                s->lead = 0;
                return 0;
            }
        }
    }
#endif
    size_t step = (size_t)1 << 22;
    for (size_t off = 0; off < len; off += step) {
        size_t n = len - off < step ? len - off : step;
        memcpy(dest + off, s->buf + off, n);
#ifdef __linux__
        if (s->mapped)
            (void)madvise(s->buf + off, n - n % 4096, MADV_DONTNEED);
#endif
    }
    stream_release(s);
    return 0;
}

/*
 * bp_free: release the handle and its buffers; aborts a run still going.
 * Accepts NULL.
 */
void bp_free(struct bp_run *run)
{
    if (run == NULL)
        return;
    bp_abort(run);
    stream_release(&run->out);
    stream_release(&run->err);
    free(run);
}
