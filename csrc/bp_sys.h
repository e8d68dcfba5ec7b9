/*
 * bp_sys.h: raw Linux system calls, for code that must not touch errno or
 * any other thread-local state of the C library.
 *
 * The containment supervisor and the leader it starts run in the caller's
 * address space (clone(CLONE_VM)) while the caller's threads keep running:
 * a libc call there would write errno into the calling thread's TLS under
 * its feet.  These helpers return the kernel's result directly: >= 0 on
 * success, -errno on failure.  x86_64 and aarch64 only; elsewhere
 * BP_HAVE_RAW_SYSCALLS is 0 and containment is not built.
 */
#ifndef BP_SYS_H
#define BP_SYS_H

#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
#define BP_HAVE_RAW_SYSCALLS 1
#else
#define BP_HAVE_RAW_SYSCALLS 0
#endif

#if BP_HAVE_RAW_SYSCALLS
#include <sys/syscall.h>

#if defined(__has_attribute)
#if __has_attribute(no_sanitize)
#define BP_NO_SANITIZE __attribute__((no_sanitize("address", "undefined")))
#endif
#endif
#ifndef BP_NO_SANITIZE
#define BP_NO_SANITIZE
#endif

/* For functions that run in the supervisor or the leader before exec. */
#define BP_RAW_FN static BP_NO_SANITIZE

static inline BP_NO_SANITIZE long bp_sys6(long n, long a, long b, long c, long d, long e, long f)
{
#if defined(__x86_64__)
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
#else
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc #0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                     : "memory");
    return x0;
#endif
}

#define bp_sys0(n) bp_sys6((n), 0, 0, 0, 0, 0, 0)
#define bp_sys1(n, a) bp_sys6((n), (long)(a), 0, 0, 0, 0, 0)
#define bp_sys2(n, a, b) bp_sys6((n), (long)(a), (long)(b), 0, 0, 0, 0)
#define bp_sys3(n, a, b, c) bp_sys6((n), (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define bp_sys4(n, a, b, c, d) bp_sys6((n), (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
#define bp_sys5(n, a, b, c, d, e) \
    bp_sys6((n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), 0)

/*
 * bp_clone_run: clone(flags) onto stack_top and run fn(arg) there, then
 * exit_group(fn's result).  In the caller it returns the child's pid, or
 * -errno.  The child never returns into the caller's frame, so it can share
 * the caller's address space (CLONE_VM) safely.  stack_top must be 16-byte
 * aligned.
 */
static inline BP_NO_SANITIZE long bp_clone_run(unsigned long flags, void *stack_top,
                                               int (*fn)(void *), void *arg)
{
#if defined(__x86_64__)
    long ret;
    register long r10 __asm__("r10") = 0;  /* child_tid */
    register long r8 __asm__("r8") = 0;    /* tls */
    __asm__ volatile(
        "syscall\n\t"
        "test %%rax, %%rax\n\t"
        "jnz 1f\n\t"
        "xor %%ebp, %%ebp\n\t"
        "mov %[arg], %%rdi\n\t"
        "call *%[fn]\n\t"
        "mov %%eax, %%edi\n\t"
        "mov %[exit], %%eax\n\t"
        "syscall\n\t"
        "hlt\n"
        "1:\n\t"
        : "=a"(ret)
        : "a"((long)SYS_clone), "D"((long)flags), "S"(stack_top), "d"(0L), "r"(r10), "r"(r8),
          [fn] "r"(fn), [arg] "r"(arg), [exit] "i"(SYS_exit_group)
        : "rcx", "r11", "memory");
    return ret;
#else
    register long x8 __asm__("x8") = SYS_clone;
    register long x0 __asm__("x0") = (long)flags;
    register long x1 __asm__("x1") = (long)stack_top;
    register long x2 __asm__("x2") = 0;  /* parent_tid */
    register long x3 __asm__("x3") = 0;  /* tls */
    register long x4 __asm__("x4") = 0;  /* child_tid */
    register long x9 __asm__("x9") = (long)fn;
    register long x10 __asm__("x10") = (long)arg;
    __asm__ volatile(
        "svc #0\n\t"
        "cbnz x0, 1f\n\t"
        "mov x29, xzr\n\t"
        "mov x0, x10\n\t"
        "blr x9\n\t"
        "mov x8, %[exit]\n\t"
        "svc #0\n\t"
        "brk #0\n"
        "1:\n\t"
        : "+r"(x0)
        : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x9), "r"(x10),
          [exit] "i"(SYS_exit_group)
        : "x30", "memory");
    return x0;
#endif
}

#endif /* BP_HAVE_RAW_SYSCALLS */
#endif
