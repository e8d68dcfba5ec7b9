/* floor.c: the machine's floor for running /bin/true with its output captured.
 *
 * Each run is what a process runner cannot do without: posix_spawn (with
 * POSIX_SPAWN_SETSID, so the command gets its own session as boundedproc's
 * do), stdout and stderr each on a pipe, both read to EOF with poll, and
 * waitpid.  Nothing else: no timeout, no containment, no output kept.
 *
 *     floor RUNS THREADS [PROGRAM]
 *
 * runs RUNS commands in all, THREADS at a time (each thread takes the next
 * run until none is left), after WARMUP untimed runs, and prints one line:
 *
 *     floor threads=4 runs=2000 wall_s=0.812345 per_run_us=406.2
 *
 * benchmarks/run.py compiles this with the machine's cc (cc -O2 -pthread) and
 * reads that line; the wall time is taken inside the program, so its own
 * start-up is not counted.  Exit status 0, or 1 with a message on stderr when
 * a run failed (spawn error, a non-zero exit).
 *
 *     floor wake ROUNDS
 *
 * measures instead what one wakeup of another process costs here: a forked
 * child echoes one byte back over a SOCK_SEQPACKET socket pair (the kind the
 * caller and a containment supervisor talk over), ROUNDS times, and it prints
 *
 *     floor wake rounds=20000 per_round_trip_us=54.0
 *
 * A contained run crosses between processes more often than an uncontained
 * one (the spec to the supervisor; the leader's exit through it): run.py's
 * B2.wake says how many such round trips containment costs a run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define WARMUP 10

static const char *program = "/bin/true";
static atomic_long remaining;
static atomic_int failed;

static void fail(const char *what, int err)
{
    fprintf(stderr, "floor: %s: %s\n", what, strerror(err));
    atomic_store(&failed, 1);
}

/* Read fd until EOF or an error; the bytes are dropped. 1 at EOF, 0 while open. */
static int drain(int fd)
{
    char buf[65536];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n > 0)
            continue;
        if (n == 0)
            return 1;
        if (errno == EINTR)
            continue;
        return errno == EAGAIN ? 0 : 1;
    }
}

static int one_run(void)
{
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) < 0) {
        fail("pipe2", errno);
        return -1;
    }
    if (pipe2(err, O_CLOEXEC) < 0) {
        fail("pipe2", errno);
        close(out[0]);
        close(out[1]);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
    char *argv[] = {(char *)program, NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, program, &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(out[1]);
    close(err[1]);
    if (rc != 0) {
        fail("posix_spawn", rc);
        close(out[0]);
        close(err[0]);
        return -1;
    }
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    struct pollfd p[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    int open_fds = 2;
    while (open_fds > 0) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            fail("poll", errno);
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (p[i].fd >= 0 && p[i].revents && drain(p[i].fd)) {
                close(p[i].fd);
                p[i].fd = -1;
                open_fds--;
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (p[i].fd >= 0)
            close(p[i].fd);
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            fail("waitpid", errno);
            return -1;
        }
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "floor: %s ended with status %d\n", program, status);
        atomic_store(&failed, 1);
        return -1;
    }
    return 0;
}

static void *worker(void *arg)
{
    (void)arg;
    while (atomic_fetch_sub(&remaining, 1) > 0 && !atomic_load(&failed))
        one_run();
    return NULL;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Round trips of one byte to a forked child and back; see the top. */
static int wake(long rounds)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        fail("socketpair", errno);
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        fail("fork", errno);
        return 1;
    }
    if (pid == 0) {
        close(sv[0]);
        char c;
        while (read(sv[1], &c, 1) == 1 && write(sv[1], &c, 1) == 1)
            ;
        _exit(0);
    }
    close(sv[1]);
    char c = 'x';
    double t0 = 0;
    int ok = 1;
    for (long i = -WARMUP; i < rounds && ok; i++) {
        if (i == 0)
            t0 = now();
        ok = write(sv[0], &c, 1) == 1 && read(sv[0], &c, 1) == 1;
    }
    double wall = now() - t0;
    close(sv[0]);  /* the child reads EOF and exits */
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!ok) {
        fail("round trip", errno);
        return 1;
    }
    printf("floor wake rounds=%ld per_round_trip_us=%.1f\n", rounds, wall / (double)rounds * 1e6);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "wake") == 0) {
        long rounds = strtol(argv[2], NULL, 10);
        if (rounds < 1) {
            fprintf(stderr, "floor: ROUNDS >= 1\n");
            return 2;
        }
        return wake(rounds);
    }
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: floor RUNS THREADS [PROGRAM] | floor wake ROUNDS\n");
        return 2;
    }
    long runs = strtol(argv[1], NULL, 10);
    long nthreads = strtol(argv[2], NULL, 10);
    if (argc == 4)
        program = argv[3];
    if (runs < 1 || nthreads < 1 || nthreads > 256) {
        fprintf(stderr, "floor: RUNS >= 1 and 1 <= THREADS <= 256\n");
        return 2;
    }
    /* Untimed warm-up, as the Python sides get: the first spawns of a fresh
     * process pay for faulting in libc's spawn path and the page cache. */
    for (int i = 0; i < WARMUP && !atomic_load(&failed); i++)
        one_run();
    if (atomic_load(&failed))
        return 1;
    atomic_store(&remaining, runs);
    pthread_t tids[256];
    double t0 = now();
    long started = 0;
    for (; started < nthreads; started++) {
        int rc = pthread_create(&tids[started], NULL, worker, NULL);
        if (rc != 0) {
            fail("pthread_create", rc);
            break;
        }
    }
    for (long i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    double wall = now() - t0;
    if (atomic_load(&failed))
        return 1;
    printf("floor threads=%ld runs=%ld wall_s=%.6f per_run_us=%.1f\n", nthreads, runs, wall,
           wall / (double)runs * 1e6);
    return 0;
}
