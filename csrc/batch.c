/*
 * batch.c: run_many's runs driven by threads of the core, with no Python
 * between one run and the next.
 *
 * A batch is a fixed number of worker threads (started as work arrives, at
 * most `jobs`), a queue of specs to run and a queue of finished runs.  The
 * caller (one Python thread, holding the specs, the results and the order in
 * which to yield them) submits a spec with a tag, and takes finished runs back
 * in any order with bp_batch_next, as many as are there in one call (each call
 * from Python may wait for the GIL), waiting if asked on an eventfd beside its
 * own wake fd (Ctrl-C).  A worker runs one spec at a time, start to BP_DONE, as
 * bp_start/bp_wait do for a caller in Python.  A run with output to take is
 * handed back still allocated (the caller takes the output and frees it); one
 * without is freed by the worker: its bp_result says all there is.
 *
 * Supervisors: each worker starts its own (on its first contained run) and
 * reuses it run after run, as a Python thread does with its pool: one run at a
 * time per supervisor, so an orphan is never attributed to another run.  It
 * is looked at before each run (bp__sup_usable) and replaced when a run left
 * it unusable, or when the worker's ids, capabilities, no_new_privs or seccomp
 * mode changed (a caller that drops root while it iterates: glibc changes
 * every thread's ids).  Its parent-death signal is tied to the worker thread,
 * which frees it (socket closed, reaped) before it ends; if the whole process
 * dies, it dies with it.  A supervisor that cannot be started is reported with
 * the run (BP_BATCH_NO_SUPERVISOR) and nothing is spawned: the caller decides
 * between a spawn failure and an uncontained run, as it does for run().
 *
 * Parked workers (Linux): a worker whose batch is freed, with a supervisor that
 * may serve again, is not ended but parked, for up to PARK_NS, as run_async's
 * idle threads are; the next batch of any thread of the process takes it up
 * instead of starting a thread and a supervisor (a run_many call of a few
 * commands otherwise paid a supervisor's start for each of its jobs:
 * benchmarks/README.md, "Supervisors kept between run_many calls").  It is taken
 * only when its supervisor is usable for the submitting thread as a thread's
 * own pool is for run() (bp__sup_usable with everything compared: ids, limits,
 * affinity, scheduling; the worker, which starts the batch's uncontained runs,
 * has what its supervisor has).  Within a batch the rest is compared only at
 * that taking: the commands of one run_many call start with its caller's
 * limits, affinity and scheduling as of its start.  A parked worker that is not
 * taken in time, or whose supervisor is not usable for the taker, ends and
 * frees its supervisor.  A forked child has none of them (park_child).  At the
 * process's exit, and before each os.fork(), they end and their threads are
 * joined (bp_batch_release_parked, which _native registers), so that their
 * supervisors are reaped here, not left to init, and a forking caller is not
 * left multi-threaded by workers it no longer uses: a worker is counted out of
 * its batch (nloose) before it leaves it, so that when bp_batch_free returns,
 * that handler sees them all.
 *
 * Telling the caller: every wakeup of the caller costs it a trip through the
 * scheduler and a cache gone cold, which at scale is most of its CPU a run
 * (benchmarks/README.md, "The Python side of a run").  So a run that ends
 * while others are still running, and more are queued, does not wake the
 * caller at once: it is told when `2 * jobs` runs are waiting for it, or by a
 * timer DEFER_NS after the first of them ended, whichever comes first.  A run
 * that ends with none other running, or with nothing left queued (a worker
 * would idle until the caller submits), wakes it at once.  Without a timerfd
 * every run wakes it.
 *
 * Signals: the workers block every signal but SIGCHLD, so Python's handlers
 * run in its own threads.  SIGCHLD is the exception: the kernel sends it to
 * the thread that started the child, and drops it there only when that
 * thread does not block it and nobody handles it; blocked in every worker, it
 * was queued for the process and woke the caller's thread (the only one
 * taking signals) at every uncontained run's end.  Unblocked, it is dropped,
 * or, with a handler of the caller's, it may interrupt a worker's poll (the
 * loop then polls again).  Cancel: a spec whose
 * cancel fd is readable when a worker picks it up is not spawned
 * (BP_BATCH_CANCELLED); one in flight ends through the core's own loop.
 */
#include "bp_internal.h"

#include <dirent.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#endif

#define BP_BATCH_THREAD_NAME "bp-batch"

/* The longest a finished run waits for company before the caller is told. */
#define DEFER_NS 2000000

/* How long a parked worker waits to be taken up, and how many may wait. */
#define PARK_NS 2000000000LL
#define MAX_PARKED 64

struct item {
    struct item *next;
    const struct bp_spec *spec;
    struct bp_result *res;
    struct bp_batch_done done;
};

struct bp_batch {
    pthread_mutex_t lock;
    pthread_cond_t todo_cv;
    struct item *todo, *todo_last;  /* FIFO: runs start in the order submitted */
    struct item *done, *done_last;
    int notify[2];                  /* [0] polled by the caller; [1] written by workers
                                       (one eventfd in both where there is one) */
    int timer;                      /* timerfd polled by the caller: a deferred telling's
                                       bound; -1: none (every run is told at once) */
    int timer_armed;
    int jobs, nthreads, idle, queued, stopping;  /* queued: items in todo */
    int running, ndone;             /* runs a worker has taken up; runs in done */
    int fd_waiting;                 /* of those, the ones waiting for fds (run_item) */
    pthread_cond_t fds_cv;          /* signalled when a run ends while some wait for fds */
    int attached;                   /* workers serving this batch (bp_batch_free waits
                                       for none) */
    pthread_cond_t detached_cv;     /* signalled when the last one leaves */
    pid_t owner;
    char *sup_path;
    char *const *sup_envp;          /* the caller's, kept alive until bp_batch_free */
    struct bp_sup **sups;           /* each worker's, for bp_batch_forget */
};

struct parked;

#ifdef __linux__
/* A parked worker, on its own stack: the taker sets b and index and signals. */
struct parked {
    struct parked *next;
    pthread_cond_t cv;
    struct bp_sup *sup;
    struct bp_batch *b;             /* set by the taker; NULL while parked */
    int index;
    int quit;                       /* told to end: by a taker that found its supervisor
                                       unusable, or at exit (bp_batch_release_parked) */
    int cv_ok;                      /* cv was made (on CLOCK_MONOTONIC) */
};

static int join_parked(struct parked *me, struct bp_sup *sup);
struct worker_arg;
static pthread_mutex_t park_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t quit_cv;      /* on CLOCK_MONOTONIC: made by park_setup */
static struct parked *parked_head;  /* the most recently parked first */
static int nparked;
static int nloose;                  /* workers out of every batch (parked, or ending) that
                                       have not yet put themselves on `ended` */
static int noparking;               /* bp_batch_release_parked is waiting for nloose 0 */
static struct worker_arg *ended;    /* workers about to return, for pthread_join */

/* A condition variable whose timed waits count on CLOCK_MONOTONIC; 0, or an errno. */
static int cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc != 0)
        return rc;
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &attr);
    (void)pthread_condattr_destroy(&attr);
    return rc;
}

/* The CLOCK_MONOTONIC time ns from now, for such a timed wait. */
static struct timespec deadline_in(int64_t ns)
{
    int64_t at = bp__now_ns() + ns;
    return (struct timespec){.tv_sec = (time_t)(at / 1000000000LL),
                             .tv_nsec = (long)(at % 1000000000LL)};
}
#endif

struct worker_arg {
    struct bp_batch *b;
    int index;
    pthread_t thread;               /* Linux: set by the worker as it ends */
    struct worker_arg *next;        /* on `ended` */
};

static void push(struct item **head, struct item **last, struct item *it)
{
    it->next = NULL;
    if (*last != NULL)
        (*last)->next = it;
    else
        *head = it;
    *last = it;
}

static struct item *pop(struct item **head, struct item **last)
{
    struct item *it = *head;
    if (it != NULL) {
        *head = it->next;
        if (*head == NULL)
            *last = NULL;
    }
    return it;
}

/* Whether a spec's cancel fd is readable now (one poll, no wait). */
static int cancelled_now(const struct bp_spec *spec)
{
    struct pollfd p[2];
    nfds_t n = 0;
    if (spec->cancel_fd >= 0)
        p[n++] = (struct pollfd){.fd = spec->cancel_fd, .events = POLLIN};
    if (spec->cancel_fd2 >= 0)
        p[n++] = (struct pollfd){.fd = spec->cancel_fd2, .events = POLLIN};
    if (n == 0)
        return 0;
    int rc;
    do {
        rc = poll(p, n, 0);
    } while (rc < 0 && errno == EINTR);
    return rc > 0;
}

/* One try at a run, start to end, with the worker's supervisor (started or
 * replaced here).  Returns 1 when it ran on a supervisor taken up again (one
 * that served a run before), else 0. */
static int run_once(struct bp_batch *b, int index, struct bp_sup **sup, struct item *it)
{
    struct bp_batch_done *d = &it->done;
    int reused = 0;
    struct bp_sup *use = NULL;
    if (it->spec->contain) {
        if (*sup != NULL && !bp__sup_usable(*sup, BP_ORIGIN_WHO)) {
            bp_sup_free(*sup);
            *sup = b->sups[index] = NULL;
        }
        if (*sup == NULL) {
            int stage = 0;
            if (bp_sup_start(b->sup_path, b->sup_envp, sup, &stage) < 0) {
                d->rc = BP_BATCH_NO_SUPERVISOR;
                d->stage = stage;
                d->err = errno;
                *sup = NULL;
                return 0;
            }
            b->sups[index] = *sup;
        } else {
            reused = 1;
        }
        use = *sup;
        d->sup_pid = bp_sup_pid(use);
    }
    struct bp_run *run = NULL;
    if (bp_start(it->spec, it->res, use, &run) < 0) {
        d->rc = BP_BATCH_NO_HANDLE;
        return 0;
    }
    int rc;
    do {
        rc = bp_wait(run);
    } while (rc == BP_AGAIN || rc == BP_CHUNK);
    d->rc = rc < 0 ? BP_BATCH_FAILED : BP_BATCH_DONE;
    if (rc < 0 || (it->res->stdout_len == 0 && it->res->stderr_len == 0))
        bp_free(run);  /* ended (killed and reaped first, on a failure) with nothing to take:
                          here, while its supervisor is surely still ours */
    else
        d->run = run;
    if (use != NULL && !bp_sup_reusable(use)) {
        bp_sup_free(use);
        *sup = b->sups[index] = NULL;
    }
    return reused;
}

/* Whether the try found the process (or the system) out of fds or out of
 * process slots (EAGAIN: RLIMIT_NPROC, which the batch's threads, supervisors and
 * commands all count against), before anything was spawned: its result is a
 * spawn failure with no output (so the run is already freed), or a supervisor
 * that could not start. */
static int out_of_room(const struct item *it)
{
    const struct bp_batch_done *d = &it->done;
    int err = d->rc == BP_BATCH_NO_SUPERVISOR ? d->err
              : d->rc == BP_BATCH_DONE && d->run == NULL && !it->res->spawned ? it->res->err_errno
              : 0;
    return err == EMFILE || err == ENFILE || err == EAGAIN;
}

/* How long a run out of fds waits for another run to end before it tries again. */
#define FD_WAIT_NS 20000000LL

/*
 * Out of fds is the batch's own doing while its other runs hold theirs (about
 * six each while they start, three after: a low RLIMIT_NOFILE and many jobs),
 * and so is out of process slots while its other commands run (a low
 * RLIMIT_NPROC: a user's threads and processes count together).
 * A run that finds it so waits, as a queued run waits for a worker, until
 * another run of the batch ends (or FD_WAIT_NS passed) and tries again, instead
 * of coming back a spawn failure that a grader would grade unrunnable (and
 * with it most of the runs after it: each fails at once and its worker takes
 * the next).  It is the run's result only when no other run of the batch is
 * under way (tried once more then: the last one may have just ended), when
 * the run's timeout passed while it waited, or when the batch is being freed.
 * Returns 1 to try again, 0 to keep the result, -1 when it was cancelled.
 */
static int wait_for_fds(struct bp_batch *b, struct item *it, int *tries_alone)
{
    pthread_mutex_lock(&b->lock);
    int others = b->running - b->fd_waiting - 1;
    int again = !b->stopping && (others > 0 || (*tries_alone)++ == 0);
    if (again && others > 0) {
        b->fd_waiting++;
#ifdef __linux__
        struct timespec until = deadline_in(FD_WAIT_NS);
        (void)pthread_cond_timedwait(&b->fds_cv, &b->lock, &until);
#else
        pthread_mutex_unlock(&b->lock);
        struct timespec ts = {0, FD_WAIT_NS};
        (void)nanosleep(&ts, NULL);
        pthread_mutex_lock(&b->lock);
#endif
        b->fd_waiting--;
    }
    pthread_mutex_unlock(&b->lock);
    if (!again)
        return 0;
    if (cancelled_now(it->spec))
        return -1;
    int64_t timeout = it->spec->timeout_ns;
    return timeout < 0 || bp__now_ns() - it->done.start_ns < timeout;
}

/* One run, start to end: tried again while the process is out of fds that the
 * batch's other runs hold (wait_for_fds). */
static void run_item(struct bp_batch *b, int index, struct bp_sup **sup, struct item *it)
{
    struct bp_batch_done *d = &it->done;
    d->start_ns = bp__now_ns();
    int tries_alone = 0, retried = 0;
    for (;;) {
        if (cancelled_now(it->spec)) {
            d->rc = BP_BATCH_CANCELLED;
            return;
        }
        int reused = run_once(b, index, sup, it);
        if (reused && !retried && d->rc == BP_BATCH_DONE && d->run == NULL
            && !it->res->spawned && it->res->runner_failed) {
            /* A supervisor that died while it waited for this run (killed from
             * outside, the OOM killer), its death not yet seen: nothing of the
             * command ran (its leader reports itself before its exec), so it
             * runs once more, on a fresh one (run_once freed this one). */
            retried = 1;
            continue;
        }
        if (!out_of_room(it))
            return;
        int w = wait_for_fds(b, it, &tries_alone);
        if (w == 0)
            return;
        if (w < 0) {
            d->rc = BP_BATCH_CANCELLED;
            return;
        }
        d->rc = 0;
        d->stage = d->err = 0;
        d->sup_pid = 0;
    }
}

static void notify(struct bp_batch *b)
{
    uint64_t one = 1;
    ssize_t w;
    do {
        w = write(b->notify[1], &one, b->notify[0] == b->notify[1] ? sizeof one : 1);
    } while (w < 0 && errno == EINTR);
    /* EAGAIN: a full pipe is already readable, which is all the caller needs */
}

/* Under the lock, a run just pushed to done: whether to wake the caller now
 * (see "Telling the caller" above); if not, the timer bounds the wait. */
static int tell_now(struct bp_batch *b)
{
    if (b->ndone >= 2 * b->jobs || b->running == 0 || b->todo == NULL || b->timer < 0)
        return 1;
#ifdef __linux__
    if (!b->timer_armed) {
        struct itimerspec in = {.it_value = {.tv_sec = 0, .tv_nsec = DEFER_NS}};
        if (timerfd_settime(b->timer, 0, &in, NULL) < 0)
            return 1;
        b->timer_armed = 1;
    }
#endif
    return 0;
}

/* Under the lock, once the caller took every finished run: no timer is due. */
static void disarm(struct bp_batch *b)
{
#ifdef __linux__
    if (b->timer_armed && b->ndone == 0) {
        struct itimerspec off;
        memset(&off, 0, sizeof off);
        (void)timerfd_settime(b->timer, 0, &off, NULL);  /* also clears one that fired */
        b->timer_armed = 0;
    }
#else
    (void)b;
#endif
}

/* Serve batch b as its worker `index` until it is freed, then leave it: once
 * attached reaches 0, bp_batch_free may free b at once, so it is not touched
 * after that.  Returns 1 when the worker left it parked (me is on the list). */
static int serve(struct bp_batch *b, int index, struct bp_sup **sup, struct parked *me)
{
    pthread_mutex_lock(&b->lock);
    for (;;) {
        struct item *it = pop(&b->todo, &b->todo_last);
        if (it == NULL) {
            if (b->stopping)
                break;
            b->idle++;
            pthread_cond_wait(&b->todo_cv, &b->lock);
            b->idle--;
            continue;
        }
        b->queued--;
        b->running++;
        pthread_mutex_unlock(&b->lock);
        run_item(b, index, sup, it);
        it->done.end_ns = bp__now_ns();
        pthread_mutex_lock(&b->lock);
        push(&b->done, &b->done_last, it);
        b->running--;
        b->ndone++;
        if (b->fd_waiting > 0)
            pthread_cond_broadcast(&b->fds_cv);  /* its fds are free: wait_for_fds */
        if (tell_now(b)) {
            /* Outside the lock: the caller we wake may run at once, on this CPU,
             * and would otherwise find the lock held and sleep on it again. */
            pthread_mutex_unlock(&b->lock);
            notify(b);
            pthread_mutex_lock(&b->lock);
        }
    }
    /* Parked (or counted as ending) before it leaves: once bp_batch_free returns,
     * bp_batch_release_parked at the process's exit sees every worker that still
     * has a supervisor to free. */
#ifdef __linux__
    int parked = join_parked(me, *sup);
#else
    int parked = 0;
    (void)me;
#endif
    b->sups[index] = NULL;
    if (--b->attached == 0)
        pthread_cond_broadcast(&b->detached_cv);
    pthread_mutex_unlock(&b->lock);
    return parked;
}

#ifdef __linux__
static void unlink_parked(struct parked *me)
{
    for (struct parked **pp = &parked_head; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == me) {
            *pp = me->next;
            nparked--;
            return;
        }
    }
}

/* Under its batch's lock, a worker that is leaving it, counted in nloose: onto the
 * parked list when its supervisor may serve again and there is room (see "Parked
 * workers" above) and nobody is ending them.  Returns 1 when parked. */
static int join_parked(struct parked *me, struct bp_sup *sup)
{
    int parked = 0;
    pthread_mutex_lock(&park_lock);
    nloose++;
    if (sup != NULL && me->cv_ok && !noparking && bp_sup_reusable(sup)
        && nparked < MAX_PARKED) {
        me->sup = sup;
        me->b = NULL;
        me->quit = 0;
        me->next = parked_head;
        parked_head = me;
        nparked++;
        parked = 1;
    }
    pthread_mutex_unlock(&park_lock);
    return parked;
}

/* A parked worker waits to be taken up.  Returns 1 with *b and *index set when a
 * new batch took it up; 0 when it is to end and free its supervisor (not taken
 * within PARK_NS, or told to end). */
static int wait_parked(struct parked *me, struct bp_batch **b, int *index)
{
    struct timespec until = deadline_in(PARK_NS);
    pthread_mutex_lock(&park_lock);
    while (me->b == NULL && !me->quit) {
        if (pthread_cond_timedwait(&me->cv, &park_lock, &until) == ETIMEDOUT
            && me->b == NULL && !me->quit) {
            unlink_parked(me);
            break;
        }
    }
    int taken = me->b != NULL;
    if (taken) {
        *b = me->b;
        *index = me->index;
    }
    pthread_mutex_unlock(&park_lock);
    return taken;
}

/* Under b->lock, for a batch that wants one more worker: take up a parked one
 * whose supervisor may serve the calling thread; one that may not is told to
 * end.  Returns 1 when one was taken. */
static int take_parked(struct bp_batch *b)
{
    int taken = 0;
    pthread_mutex_lock(&park_lock);
    while (!taken && parked_head != NULL) {
        struct parked *p = parked_head;
        parked_head = p->next;
        nparked--;
        if (bp__sup_usable(p->sup, BP_ORIGIN_ALL)) {
            p->b = b;
            p->index = b->nthreads;
            b->sups[b->nthreads] = p->sup;
            b->nthreads++;
            b->attached++;
            nloose--;
            taken = 1;
        } else {
            p->quit = 1;
        }
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&park_lock);
    return taken;
}

/* fork(): the child has none of the parked workers.  Its copies of their
 * supervisors' sockets are closed (the parent's closing its own then still
 * ends them), and park_lock, held across the fork, is made anew. */
static void park_prepare(void)
{
    pthread_mutex_lock(&park_lock);
}

static void park_parent(void)
{
    pthread_mutex_unlock(&park_lock);
}

static void park_child(void)
{
    for (struct parked *p = parked_head; p != NULL; p = p->next)
        bp_sup_forget(p->sup);
    parked_head = NULL;
    nparked = nloose = noparking = 0;
    while (ended != NULL) {  /* threads of the parent's: never to be joined here */
        struct worker_arg *next = ended->next;
        free(ended);
        ended = next;
    }
    pthread_mutex_init(&park_lock, NULL);
    (void)cond_init_monotonic(&quit_cv);
}

static void park_setup(void)
{
    (void)cond_init_monotonic(&quit_cv);
    (void)pthread_atfork(park_prepare, park_parent, park_child);
}

static pthread_once_t park_once = PTHREAD_ONCE_INIT;

/* Join the workers that have ended (or are about to return): their threads are
 * joinable, so that whoever must know them gone (a fork) can wait for it. */
static void join_ended(void)
{
    pthread_mutex_lock(&park_lock);
    struct worker_arg *list = ended;
    ended = NULL;
    pthread_mutex_unlock(&park_lock);
    while (list != NULL) {
        struct worker_arg *next = list->next;
        (void)pthread_join(list->thread, NULL);
        free(list);
        list = next;
    }
}

/* bp_batch_release_parked: end every worker that is out of a batch now (tell the
 * parked ones to end; none parks meanwhile), wait (at most about a second) until
 * each has freed its supervisor, and join their threads.  At the process's exit
 * (_native registers it with atexit), so that the supervisors are reaped here
 * instead of being left to init as zombies; and before os.fork() (registered
 * with os.register_at_fork), so that a caller that forks after run_many is
 * not multi-threaded because of us (Python 3.12+ warns of a fork with threads:
 * "may lead to deadlocks in the child").  Workers serving a batch are
 * left alone. */
void bp_batch_release_parked(void)
{
    (void)pthread_once(&park_once, park_setup);
    pthread_mutex_lock(&park_lock);
    for (struct parked *p = parked_head; p != NULL; p = p->next) {
        p->quit = 1;
        pthread_cond_signal(&p->cv);
    }
    parked_head = NULL;
    nparked = 0;
    noparking++;
    struct timespec until = deadline_in(1000000000LL);
    while (nloose > 0 && pthread_cond_timedwait(&quit_cv, &park_lock, &until) != ETIMEDOUT)
        ;
    noparking--;
    pthread_mutex_unlock(&park_lock);
    join_ended();
}

/* The last step of a worker out of every batch, its supervisor freed. */
static void worker_ended(struct worker_arg *arg)
{
    arg->thread = pthread_self();
    pthread_mutex_lock(&park_lock);
    arg->next = ended;
    ended = arg;
    if (--nloose == 0)
        pthread_cond_broadcast(&quit_cv);
    pthread_mutex_unlock(&park_lock);
}
#else
static int take_parked(struct bp_batch *b)
{
    (void)b;
    return 0;
}

void bp_batch_release_parked(void)
{
}
#endif

static void *worker(void *p)
{
    struct worker_arg *arg = p;
    struct bp_batch *b = arg->b;
    int index = arg->index;
    struct bp_sup *sup = NULL;
#ifdef __linux__
    (void)pthread_setname_np(pthread_self(), BP_BATCH_THREAD_NAME);  /* ps -L, gdb, the tests */
#endif
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    pthread_sigmask(SIG_UNBLOCK, &chld, NULL);  /* see "Signals" above */
#ifdef __linux__
    struct parked me;
    memset(&me, 0, sizeof me);
    me.cv_ok = cond_init_monotonic(&me.cv) == 0;
    while (serve(b, index, &sup, &me) && wait_parked(&me, &b, &index))
        ;
    if (me.cv_ok)
        pthread_cond_destroy(&me.cv);  /* off the list: nobody signals it any more */
    if (sup != NULL)
        bp_sup_free(sup);
    worker_ended(arg);  /* arg is joined and freed by join_ended */
#else
    free(arg);
    (void)serve(b, index, &sup, NULL);
    if (sup != NULL)
        bp_sup_free(sup);
#endif
    return NULL;
}

/* The fds a worker may hold at once: its supervisor's (2) and a starting run's (6). */
#define FDS_A_WORKER 8

/* The fds this process has open now; -1: unknown. */
static long open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    long n = -1;  /* the directory's own fd */
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

/*
 * The workers that RLIMIT_NOFILE leaves room for, at most `jobs`: under a low
 * limit (ulimit -n 256 and jobs=64), or with most of the limit already open
 * (1,000 of 1,024), workers past it would hold supervisors that leave no fd
 * for any run's pipes, and every run would wait for fds (wait_for_fds) until
 * it came back EMFILE.  The open fds are counted (one read of /proc/self/fd,
 * about 10 us with a few dozen open) unless the limit is past 65,536 and the
 * workers would need under half of it: there a caller has rarely opened the
 * rest, and the count would read what may be a very long list.  run_many's
 * Python workers, whose threads hold supervisors too, are capped by it as well
 * (_scale.py).
 */
int bp_jobs_within_fd_limit(int jobs)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY
        || (rl.rlim_cur > 65536 && (rlim_t)jobs * FDS_A_WORKER + 64 <= rl.rlim_cur / 2))
        return jobs;
    long open = open_fds();
    long room = ((long)rl.rlim_cur - (open >= 0 ? open : 16)) / FDS_A_WORKER;
    return room < 1 ? 1 : room < jobs ? (int)room : jobs;
}

int bp_batch_new(int jobs, const char *sup_path, char *const *sup_envp, struct bp_batch **out)
{
    *out = NULL;
    if (jobs < 1) {
        errno = EINVAL;
        return -1;
    }
    struct bp_batch *b = calloc(1, sizeof *b);
    if (b == NULL)
        return -1;
    b->jobs = bp_jobs_within_fd_limit(jobs);
    b->owner = getpid();
    b->sup_envp = sup_envp;
    b->notify[0] = b->notify[1] = -1;
    b->timer = -1;
    b->sup_path = sup_path != NULL ? strdup(sup_path) : NULL;
    b->sups = calloc((size_t)b->jobs, sizeof *b->sups);
    if ((sup_path != NULL && b->sup_path == NULL) || b->sups == NULL)
        goto fail;
#ifdef __linux__
    (void)pthread_once(&park_once, park_setup);
    join_ended();  /* the workers that ended since: their threads' memory */
    b->notify[0] = b->notify[1] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (b->notify[0] < 0)
        goto fail;
    b->timer = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);  /* -1: tell at once */
#else
    if (bp__make_pipe(b->notify) < 0 || bp__set_nonblock(b->notify[0]) < 0
        || bp__set_nonblock(b->notify[1]) < 0)
        goto fail;
#endif
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->todo_cv, NULL);
    pthread_cond_init(&b->detached_cv, NULL);
#ifdef __linux__
    if (cond_init_monotonic(&b->fds_cv) != 0)
#endif
        pthread_cond_init(&b->fds_cv, NULL);
    *out = b;
    return 0;
fail:;
    int saved = errno;
    if (b->timer >= 0)
        close(b->timer);
    if (b->notify[1] >= 0 && b->notify[1] != b->notify[0])
        close(b->notify[1]);
    if (b->notify[0] >= 0)
        close(b->notify[0]);
    free(b->sup_path);
    free(b->sups);
    free(b);
    errno = saved;
    return -1;
}

/* A worker, started with every signal blocked (the mask is inherited; it unblocks
 * SIGCHLD itself): bp_batch_free waits for it to leave the batch, not to end (it
 * may be parked for the next).  On Linux it is joinable (join_ended); elsewhere,
 * detached. */
static int start_worker(struct bp_batch *b)
{
    struct worker_arg *arg = malloc(sizeof *arg);
    if (arg == NULL)
        return ENOMEM;
    arg->b = b;
    arg->index = b->nthreads;
#ifdef __linux__
    int detached = 0;
#else
    int detached = 1;
#endif
    pthread_t thread;
    int rc = bp__quiet_thread(&thread, 256 * 1024, detached, worker, arg);
    if (rc != 0) {
        free(arg);
        return rc;
    }
    b->nthreads++;
    b->attached++;
    return 0;
}

int bp_batch_submit(struct bp_batch *b, const struct bp_spec *spec, struct bp_result *res,
                    int64_t tag)
{
    struct item *it = calloc(1, sizeof *it);
    if (it == NULL)
        return -1;
    it->spec = spec;
    it->res = res;
    it->done.tag = tag;
    pthread_mutex_lock(&b->lock);
    /* Each idle worker takes one queued item; a worker signalled but not yet awake
     * still counts as idle, so compare with what is queued, not with zero. */
    if (b->idle <= b->queued && b->nthreads < b->jobs && !take_parked(b)) {
        int rc = start_worker(b);
        if (rc != 0 && b->nthreads == 0) {
            pthread_mutex_unlock(&b->lock);
            free(it);
            errno = rc;
            return -1;  /* no thread at all: nothing would ever run it */
        }
        /* otherwise the workers there are take it in their turn */
    }
    push(&b->todo, &b->todo_last, it);
    b->queued++;
    pthread_cond_signal(&b->todo_cv);
    pthread_mutex_unlock(&b->lock);
    return 0;
}

int bp_batch_next(struct bp_batch *b, int wake_fd, int wait, struct bp_batch_done *out, int n)
{
    for (;;) {
        int got = 0;
        pthread_mutex_lock(&b->lock);
        struct item *it;
        while (got < n && (it = pop(&b->done, &b->done_last)) != NULL) {
            out[got++] = it->done;
            b->ndone--;
            free(it);
        }
        disarm(b);
        pthread_mutex_unlock(&b->lock);
        if (got > 0 || !wait)
            return got;
        struct pollfd p[3] = {{.fd = b->notify[0], .events = POLLIN},
                              {.fd = b->timer, .events = POLLIN},
                              {.fd = wake_fd, .events = POLLIN}};
        int rc = poll(p, 3, -1);  /* a negative fd is left out */
        if (rc < 0) {
            if (errno == EINTR)
                return 0;  /* a signal: its handler may want to run */
            return -1;
        }
        uint64_t drained;
        if (p[0].revents != 0)
            while (read(b->notify[0], &drained, sizeof drained) > 0)
                ;
        if (p[1].revents != 0)
            (void)read(b->timer, &drained, sizeof drained);
        if (wake_fd >= 0 && p[2].revents != 0)
            return 0;
    }
}

void bp_batch_free(struct bp_batch *b)
{
    if (b == NULL)
        return;
    pthread_mutex_lock(&b->lock);
    b->stopping = 1;
    pthread_cond_broadcast(&b->todo_cv);
    pthread_cond_broadcast(&b->fds_cv);
    while (b->attached > 0)  /* each finishes its run and leaves (serve) */
        pthread_cond_wait(&b->detached_cv, &b->lock);
    pthread_mutex_unlock(&b->lock);
    struct item *it;
    while ((it = pop(&b->done, &b->done_last)) != NULL) {
        bp_free(it->done.run);
        free(it);
    }
    if (b->notify[1] != b->notify[0])
        close(b->notify[1]);
    close(b->notify[0]);
    if (b->timer >= 0)
        close(b->timer);
    pthread_cond_destroy(&b->todo_cv);
    pthread_cond_destroy(&b->detached_cv);
    pthread_cond_destroy(&b->fds_cv);
    pthread_mutex_destroy(&b->lock);
    free(b->sup_path);
    free(b->sups);
    free(b);
}

void bp_batch_forget(struct bp_batch *b)
{
    /* In a forked child: none of the threads exist here, and the lock may be
     * held forever.  Close our copies of the supervisors' sockets (so that
     * the parent's closing them still ends them) and of the notify fds;
     * the memory stays. */
    if (b == NULL || b->owner == getpid())
        return;
    for (int i = 0; i < b->jobs; i++) {
        if (b->sups[i] != NULL)
            bp_sup_forget(b->sups[i]);
        b->sups[i] = NULL;
    }
    if (b->notify[1] != b->notify[0])
        close(b->notify[1]);
    close(b->notify[0]);
    if (b->timer >= 0)
        close(b->timer);
    b->notify[0] = b->notify[1] = b->timer = -1;
}
