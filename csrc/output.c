/*
 * output.c: what the core keeps of the command's stdout and stderr.
 *
 * The cap (max_output) counts both streams together, in arrival order, and
 * spec->keep says which of its bytes are kept (see head_budget).  Kept head
 * bytes live in one buffer per stream, kept tail bytes in one ring for both;
 * the rest is read into a scratch buffer and dropped, so the child never
 * blocks on a full pipe and the caller's memory stays bounded.  Every buffer
 * hangs off the run handle: nothing here is on the stack or global, and
 * many runs read at once in many threads.
 *
 * With spec->report_chunks every read that produced bytes is also handed to
 * the caller before the next one (bp_wait returns BP_CHUNK, bp_chunk says
 * where the bytes are), which is why a read goes straight into the memory
 * that keeps it, or into scratch: the chunk is the bytes where they landed.
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

/* ---- budgets ------------------------------------------------------------ */

/* SPEC 9.3: of max_output, keep="head" keeps the first max_output bytes read
 * (across both streams, in arrival order), "tail" the last max_output, and
 * "head+tail" the first max_output / 2 and the last max_output - that.  The
 * head lives in each stream's own buffer (out.buf, err.buf), the tail in the
 * ring of struct bp_tail; a byte that fits neither is read into scratch. */
static uint64_t head_budget(const struct bp_spec *spec)
{
    if (spec->max_output < 0)
        return UINT64_MAX;
    uint64_t m = (uint64_t)spec->max_output;
    if (spec->keep == BP_KEEP_TAIL)
        return 0;
    if (spec->keep == BP_KEEP_HEAD_TAIL)
        return m / 2;
    return m;
}

static size_t tail_budget(const struct bp_spec *spec)
{
    if (spec->max_output < 0 || spec->keep == BP_KEEP_HEAD)
        return 0;
    uint64_t t = (uint64_t)spec->max_output - head_budget(spec);
    return t > SIZE_MAX ? SIZE_MAX : (size_t)t;
}

static int no_memory(struct bp_result *res)
{
    res->err_stage = BP_STAGE_ALLOC;
    res->err_errno = ENOMEM;
    errno = ENOMEM;
    return -1;
}

/* ---- the tail ring -------------------------------------------------------- */

#define WORD_BITS 64u

/* Set bits [from, from + n) of bits to v (0 or 1). */
static void set_bits(uint64_t *bits, size_t from, size_t n, int v)
{
    size_t end = from + n;
    while (from < end) {
        size_t w = from / WORD_BITS;
        unsigned b = (unsigned)(from % WORD_BITS);
        size_t span = WORD_BITS - b < end - from ? WORD_BITS - b : end - from;
        uint64_t mask = span == WORD_BITS ? ~(uint64_t)0 : (((uint64_t)1 << span) - 1) << b;
        if (v)
            bits[w] |= mask;
        else
            bits[w] &= ~mask;
        from += span;
    }
}

/* The number of set bits in [0, n). */
static size_t count_bits(const uint64_t *bits, size_t n)
{
    size_t count = 0, w = 0;
    for (; (w + 1) * WORD_BITS <= n; w++)
        count += (size_t)__builtin_popcountll(bits[w]);
    unsigned rest = (unsigned)(n - w * WORD_BITS);
    if (rest > 0)
        count += (size_t)__builtin_popcountll(bits[w] & (((uint64_t)1 << rest) - 1));
    return count;
}

/* The first index in [pos, end) whose bit is not v, or end. */
static size_t run_end(const uint64_t *bits, size_t pos, size_t end, int v)
{
    uint64_t flip = v ? ~(uint64_t)0 : 0;
    while (pos < end) {
        size_t w = pos / WORD_BITS;
        unsigned b = (unsigned)(pos % WORD_BITS);
        uint64_t differ = (bits[w] ^ flip) >> b;
        if (differ != 0) {
            size_t p = pos + (size_t)__builtin_ctzll(differ);
            return p < end ? p : end;
        }
        pos = (w + 1) * WORD_BITS;
    }
    return end;
}

/* Ring bytes that are valid: all of it once it wrapped. */
static size_t ring_valid(const struct bp_tail *t, size_t limit)
{
    return t->wrapped ? limit : t->wpos;
}

/* Bytes of stream (BP_STDOUT/BP_STDERR) in the ring and not yet taken. */
static size_t ring_count(const struct bp_run *run, int stream)
{
    const struct bp_tail *t = &run->output.tail;
    if (t->ring.buf == NULL || t->taken[stream - 1])
        return 0;  /* never used, or released once both streams were taken */
    size_t valid = ring_valid(t, tail_budget(run->spec));
    if (t->solo)
        return t->solo == stream ? valid : 0;
    size_t err = count_bits(t->bits, valid);
    return stream == BP_STDERR ? err : valid - err;
}

/* Make room at t->wpos for the next read of s into the ring (limit bytes
 * when grown): the first time, decide whether it needs its stream bits. */
static int ring_reserve(struct bp_run *run, struct bp_stream *s, size_t limit)
{
    struct bp_tail *t = &run->output.tail;
    if (!t->started) {
        /* A stream at EOF never reads again: with the other one closed,
         * every ring byte is this stream's and no bits are needed. */
        const struct bp_stream *other = s == &run->out ? &run->err : &run->out;
        if (other->fd < 0)
            t->solo = s == &run->out ? BP_STDOUT : BP_STDERR;
        t->started = 1;
    }
    if (t->wrapped || t->wpos < t->ring.cap)
        return 0;
    size_t need = t->wpos + (limit - t->wpos < READ_CHUNK ? limit - t->wpos : READ_CHUNK);
    t->ring.len = t->wpos;  /* what stream_reserve preserves */
    if (stream_reserve(&t->ring, need, limit, 0) < 0)
        return -1;
    if (!t->solo) {
        size_t usable = t->ring.cap < limit ? t->ring.cap : limit;
        size_t words = (usable + WORD_BITS - 1) / WORD_BITS;
        if (words > t->nwords) {
            void *p = realloc(t->bits, words * sizeof *t->bits);
            if (p == NULL)
                return -1;
            t->bits = p;
            t->nwords = words;
        }
    }
    return 0;
}

/* ---- reading -------------------------------------------------------------- */

/* With report_chunks, one read (one chunk) takes at most this much, kept or not.
 * The caller copies each chunk out (on_output gets a fresh bytes) before the next
 * read: a quarter of a MiB is still in this CPU's cache when it does, where the
 * whole 1 MiB pipe read at once was not, and the copy then held the reader (and so
 * the writer) for long enough to cost a quarter of the capture's speed (B4.cb in
 * benchmarks/README.md).  Without report_chunks kept bytes are read straight into
 * buffers that grow by doubling, as much as the pipe holds, up to PREFAULT_WINDOW. */
#define CHUNK_MAX ((size_t)1 << 18)

#if defined(__linux__)
/* Fault the next pages of s in before read(), not inside it: a read that
 * faults does so holding the pipe's lock, and the writer spins on that lock
 * instead of refilling the pipe meanwhile.  At most one window is faulted
 * ahead of pos, so RSS tracks the output.  Returns want, clamped to it. */
static size_t prefault(struct bp_stream *s, size_t pos, size_t want)
{
    if (!s->mapped)
        return want;
    if (want > PREFAULT_WINDOW)
        want = PREFAULT_WINDOW;
    if (pos + want > s->populated && s->populated < s->cap) {
        size_t pg = page_size();
        size_t from = s->populated > pos ? s->populated : pos;
        size_t span = s->cap - from < PREFAULT_WINDOW ? s->cap - from : PREFAULT_WINDOW;
        uintptr_t lo = ((uintptr_t)(s->buf + from)) & ~(uintptr_t)(pg - 1);
        uintptr_t hi = (uintptr_t)(s->buf + from + span);
        if (madvise((void *)lo, (size_t)(hi - lo), BP_MADV_POPULATE_WRITE) == 0)
            s->populated = from + span;
        else
            s->populated = s->cap;  /* unsupported (before 5.14): let read fault */
    }
    return want;
}
#else
static size_t prefault(struct bp_stream *s, size_t pos, size_t want)
{
    (void)s;
    (void)pos;
    return want;
}
#endif

enum { TO_HEAD, TO_RING, TO_SCRATCH };

/* got bytes of s were just written at the ring's wpos: their stream bits, and
 * the write position, wrapping at limit. */
static void ring_advance(struct bp_run *run, struct bp_stream *s, size_t got, size_t limit)
{
    struct bp_tail *t = &run->output.tail;
    if (t->wrapped)
        run->res->output_truncated = 1;  /* as many old bytes were just overwritten */
    if (!t->solo)
        set_bits(t->bits, t->wpos, got, s == &run->err);
    t->wpos += got;
    if (!t->wrapped)
        t->ring.len = t->wpos;
    if (t->wpos == limit) {
        t->wpos = 0;
        t->wrapped = 1;
    }
}

/* n bytes of s, read into scratch, into a ring of limit bytes: only the last
 * limit of them can stay, the rest is omitted.  Returns 0, or -1 out of
 * memory. */
static int ring_put(struct bp_run *run, struct bp_stream *s, const unsigned char *src, size_t n,
                    size_t limit)
{
    struct bp_tail *t = &run->output.tail;
    if (n > limit) {
        run->res->output_truncated = 1;
        src += n - limit;
        n = limit;
    }
    while (n > 0) {
        if (ring_reserve(run, s, limit) < 0)
            return -1;
        size_t end = t->ring.cap < limit ? t->ring.cap : limit;
        size_t k = end - t->wpos < n ? end - t->wpos : n;
        memcpy(t->ring.buf + t->wpos, src, k);
        ring_advance(run, s, k, limit);
        src += k;
        n -= k;
    }
    return 0;
}

/* One read() of s, into its head, the tail ring or scratch, as the budgets
 * say.  Returns 1 when the pipe may hold more, 0 when it is empty for now
 * (or at EOF, or past the cap under overflow_kill), -1 on allocation
 * failure (err_stage BP_STAGE_ALLOC, errno ENOMEM). */
static int read_once(struct bp_run *run, struct bp_stream *s)
{
    const struct bp_spec *spec = run->spec;
    struct bp_result *res = run->res;
    struct bp_output *o = &run->output;
    size_t room = SIZE_MAX;
    if (spec->max_output >= 0) {
        uint64_t cap = head_budget(spec);
        uint64_t left = run->kept >= cap ? 0 : cap - run->kept;
        room = left > SIZE_MAX ? SIZE_MAX : (size_t)left;
    }
    size_t tlimit = room > 0 ? 0 : tail_budget(spec);
    unsigned char *dst;
    size_t want;
    int where;
    if (room > 0) {
        size_t need = s->len + (room < READ_CHUNK ? room : READ_CHUNK);
        size_t limit = room > SIZE_MAX - s->len ? SIZE_MAX : s->len + room;
        if (stream_reserve(s, need, limit, spec->out_page_offset) < 0)
            return no_memory(res);
        dst = s->buf + s->len;
        want = s->cap - s->len;
        if (want > room)
            want = room;
        want = prefault(s, s->len, want);
        where = TO_HEAD;
    } else if (tlimit >= READ_CHUNK) {
        struct bp_tail *t = &o->tail;
        if (ring_reserve(run, s, tlimit) < 0)
            return no_memory(res);
        size_t end = t->ring.cap < tlimit ? t->ring.cap : tlimit;
        dst = t->ring.buf + t->wpos;
        want = prefault(&t->ring, t->wpos, end - t->wpos);
        where = TO_RING;
    } else {
        /* Past the cap; or into a small tail budget, where reading only up to
         * the ring's wrap would take a few bytes a read (and a callback), so
         * a whole read lands here and its last bytes are put in the ring. */
        size_t size = spec->report_chunks ? CHUNK_MAX : READ_CHUNK;
        if (o->scratch_cap < size) {
            free(o->scratch);
            o->scratch_cap = 0;
            if ((o->scratch = malloc(size)) == NULL)
                return no_memory(res);
            o->scratch_cap = size;
        }
        dst = o->scratch;
        want = o->scratch_cap;
        where = TO_SCRATCH;
    }
    if (spec->report_chunks && want > CHUNK_MAX)
        want = CHUNK_MAX;
    ssize_t n = read(s->fd, dst, want);
    if (n < 0) {
        if (errno == EINTR)
            return 1;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            /* EIO and the like: nothing more will come, and the output may be
             * short; the result says so (runner failed: ... read). */
            if (res->err_stage == BP_STAGE_NONE) {
                res->err_stage = BP_STAGE_READ;
                res->err_errno = errno;
            }
            bp__close_fd(&s->fd);
        }
        return 0;
    }
    if (n == 0) {
        bp__close_fd(&s->fd);
        return 0;
    }
    size_t got = (size_t)n;
    res->output_bytes += (uint64_t)got;
    s->read += (uint64_t)got;
    if (spec->report_chunks) {
        o->chunk.pending = 1;
        o->chunk.stream = o->chunk.last = s == &run->err ? BP_STDERR : BP_STDOUT;
        o->chunk.ptr = dst;
        o->chunk.len = got;
    }
    if (where == TO_HEAD) {
        s->len += got;
        run->kept += (uint64_t)got;
    } else if (where == TO_RING) {
        ring_advance(run, s, got, tlimit);
    } else if (tlimit > 0) {
        if (ring_put(run, s, dst, got, tlimit) < 0)
            return no_memory(res);
    } else {
        res->output_truncated = 1;
        if (spec->overflow_kill && run->phase == BP_PHASE_RUNNING)
            return 0;  /* the caller ends the run */
    }
    return got < want ? 0 : 1;
}

/* Read what is ready on s: up to READS_PER_WAKE reads, or one read that
 * produced bytes with report_chunks.  Returns 0, or -1 on allocation
 * failure. */
static int read_stream(struct bp_run *run, struct bp_stream *s)
{
    for (int i = 0; i < READS_PER_WAKE && s->fd >= 0; i++) {
        int r = read_once(run, s);
        if (r <= 0)
            return r;
        if (run->output.chunk.pending)
            return 0;
    }
    return 0;
}

/* The poll loop found stdout and/or stderr readable: read them.  With
 * report_chunks, stop at the first read that produced bytes (the chunk is
 * then pending for bp_wait to return), and let the streams take turns so
 * that a busy one cannot starve the other.  Returns 0, or -1 on allocation
 * failure (err_stage and errno set). */
int bp__read_ready(struct bp_run *run, int out_ready, int err_ready)
{
    struct bp_stream *first = &run->out, *second = &run->err;
    int first_ready = out_ready, second_ready = err_ready;
    if (run->spec->report_chunks && run->output.chunk.last == BP_STDOUT) {
        first = &run->err;
        second = &run->out;
        first_ready = err_ready;
        second_ready = out_ready;
    }
    if (first_ready && read_stream(run, first) < 0)
        return -1;
    if (second_ready && !run->output.chunk.pending && read_stream(run, second) < 0)
        return -1;
    return 0;
}

/* bp_wait, at the top of its loop: 1 when a chunk was read and is to be
 * returned as BP_CHUNK now (it becomes bp_chunk()'s), else 0. */
int bp__chunk_deliver(struct bp_run *run)
{
    struct bp_chunk *c = &run->output.chunk;
    if (!c->pending)
        return 0;
    c->pending = 0;
    c->valid = 1;
    return 1;
}

/* bp_wait, on entry: the chunk it returned last is no longer the caller's. */
void bp__chunk_release(struct bp_run *run)
{
    run->output.chunk.valid = 0;
}

/*
 * bp_chunk: the chunk that made the last bp_wait() return BP_CHUNK: its
 * stream (BP_STDOUT, or BP_STDERR), where its bytes are and how many.  The
 * bytes are the ones read, kept or not, and stay valid until the next
 * bp_wait() or bp_free() on the run.  Returns 0, or -1 with errno EINVAL
 * when the last bp_wait() did not return BP_CHUNK (then writes nothing).
 */
int bp_chunk(struct bp_run *run, int *stream, const unsigned char **ptr, size_t *len)
{
    const struct bp_chunk *c = &run->output.chunk;
    if (!c->valid) {
        errno = EINVAL;
        return -1;
    }
    *stream = c->stream;
    *ptr = c->ptr;
    *len = c->len;
    return 0;
}

/* Called from bp__finish_result once the run is over: each stream's kept
 * length (its head and its bytes in the tail ring), bytes read, and gap: the
 * index in its kept bytes where the omitted ones were (the length of its
 * head part: all of it for keep="head", 0 for "tail"), -1 when none was
 * omitted.  Sets output_truncated when any byte was. */
void bp__output_finish(struct bp_run *run)
{
    struct bp_result *res = run->res;
    res->stdout_read = run->out.read;
    res->stderr_read = run->err.read;
    res->stdout_len = (uint64_t)run->out.len + ring_count(run, BP_STDOUT);
    res->stderr_len = (uint64_t)run->err.len + ring_count(run, BP_STDERR);
    res->stdout_gap = res->stdout_read > res->stdout_len ? (int64_t)run->out.len : -1;
    res->stderr_gap = res->stderr_read > res->stderr_len ? (int64_t)run->err.len : -1;
    if (res->stdout_gap >= 0 || res->stderr_gap >= 0)
        res->output_truncated = 1;
}

static void tail_release(struct bp_tail *t)
{
    stream_release(&t->ring);
    free(t->bits);
    t->bits = NULL;
    t->nwords = 0;
}

/* bp_free: every buffer of the run's output. */
void bp__output_release(struct bp_run *run)
{
    stream_release(&run->out);
    stream_release(&run->err);
    tail_release(&run->output.tail);
    free(run->output.scratch);
    run->output.scratch = NULL;
    run->output.scratch_cap = 0;
    run->output.chunk.valid = run->output.chunk.pending = 0;
}

/* Copy s's head (s->len bytes) to dest and release it: whole pages move
 * with mremap when dest allows (see bp_take_output), the rest is copied. */
static void take_head(struct bp_stream *s, unsigned char *dest)
{
    size_t len = s->len;
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
                return;
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
}

/* Copy the ring bytes of stream (oldest first) to dest and return how many.
 * When no other stream still needs the ring, each block's pages are
 * released once copied, so the ring and the result never both sit whole. */
static size_t take_ring(struct bp_run *run, int stream, unsigned char *dest)
{
    struct bp_tail *t = &run->output.tail;
    size_t limit = tail_budget(run->spec);
    size_t valid = ring_valid(t, limit);
    int other = stream == BP_STDOUT ? BP_STDERR : BP_STDOUT;
    int release = t->ring.mapped && ring_count(run, other) == 0;
    int v = stream == BP_STDERR;
    size_t out = 0;
    /* Oldest first: [wpos, limit) then [0, wpos) once it wrapped. */
    size_t segs[2][2] = {{t->wrapped ? t->wpos : 0, valid}, {0, t->wrapped ? t->wpos : 0}};
    size_t block = (size_t)1 << 20;  /* released in steps this size: the peak stays low */
    for (int k = 0; k < 2; k++) {
        for (size_t b0 = segs[k][0]; b0 < segs[k][1]; b0 += block) {
            size_t b1 = segs[k][1] - b0 < block ? segs[k][1] : b0 + block;
            if (t->solo) {
                memcpy(dest + out, t->ring.buf + b0, b1 - b0);
                out += b1 - b0;
            } else {
                for (size_t pos = b0; pos < b1;) {
                    int mine = (int)((t->bits[pos / WORD_BITS] >> (pos % WORD_BITS)) & 1) == v;
                    size_t e = run_end(t->bits, pos, b1, mine ? v : !v);
                    if (mine) {
                        memcpy(dest + out, t->ring.buf + pos, e - pos);
                        out += e - pos;
                    }
                    pos = e;
                }
            }
#ifdef __linux__
            if (release) {
                size_t pg = page_size();
                uintptr_t lo = ((uintptr_t)(t->ring.buf + b0) + pg - 1) & ~(uintptr_t)(pg - 1);
                uintptr_t hi = ((uintptr_t)(t->ring.buf + b1)) & ~(uintptr_t)(pg - 1);
                if (hi > lo)
                    (void)madvise((void *)lo, (size_t)(hi - lo), MADV_DONTNEED);
            }
#endif
        }
    }
    return out;
}

/*
 * bp_take_output: once bp_wait() returned BP_DONE, copy the kept bytes of
 * stream (BP_STDOUT or BP_STDERR) to dest, which holds exactly len bytes
 * (res->stdout_len or res->stderr_len): the stream's head part, then its
 * bytes in the tail ring (keep="tail", "head+tail"), in order.  The core's
 * memory is released as the copy goes, so that the two copies never both
 * sit in memory whole; with keep="head" whole pages are moved, not copied,
 * when dest sits at spec->out_page_offset in its page.  Returns 0, or -1
 * with errno EINVAL when stream or len is wrong (then nothing is copied).
 * Afterwards the stream's kept length is 0.
 */
int bp_take_output(struct bp_run *run, int stream, unsigned char *dest, size_t len)
{
    struct bp_stream *s = stream == BP_STDOUT ? &run->out : stream == BP_STDERR ? &run->err : NULL;
    if (s == NULL) {
        errno = EINVAL;
        return -1;
    }
    size_t in_ring = ring_count(run, stream);
    if (len != s->len + in_ring || len < s->len) {
        errno = EINVAL;
        return -1;
    }
    size_t head = s->len;
    if (head > 0)
        take_head(s, dest);
    struct bp_tail *t = &run->output.tail;
    if (in_ring > 0)
        (void)take_ring(run, stream, dest + head);
    t->taken[stream - 1] = 1;
    if (t->started && ring_count(run, BP_STDOUT) == 0 && ring_count(run, BP_STDERR) == 0)
        tail_release(t);
    return 0;
}
