/*
 * output.c: what the core keeps of the command's stdout and stderr.
 *
 * The kept bytes live in one buffer per stream; the cap (max_output) counts
 * both streams together, in arrival order.  Past it, bytes are read into a
 * scratch buffer and dropped, so the child never blocks on a full pipe and
 * the caller's memory stays bounded.
 */
#include "bp_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/mman.h>
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

/* ---- output buffers ---------------------------------------------------- */

static size_t page_size(void)
{
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 4096;
}

void bp__stream_release(struct bp_stream *s)
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

/* Read what is ready on one stream.  Returns 0, or -1 on allocation failure.
 * Bytes within the combined cap are kept in arrival order; bytes past it are
 * read into a stack buffer and dropped, so the child never blocks on a full
 * pipe and the caller's memory stays bounded. */
int bp__read_stream(struct bp_run *run, struct bp_stream *s)
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
        s->read += (uint64_t)n;
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
    bp__stream_release(s);
    return 0;
}

