#!/usr/bin/env bash
# Run the test suite against an ASan+UBSan build of the C core.
#
#   scripts/sanitize.sh                 # the whole suite
#   scripts/sanitize.sh tests/test_run.py -k deadline   # any pytest arguments
#
# The working tree (tracked and untracked, not ignored) is copied to a scratch directory, the
# extension and the supervisor program are built there with -fsanitize=address,undefined, and
# pytest runs from that copy with the ASan runtime preloaded (CPython is not instrumented, so
# the runtime must come first in the library list). Leak detection is off: CPython leaks by
# design at exit; scripts/valgrind.sh checks the core for leaks. Any ASan report or UBSan
# finding aborts the process that made it, so it fails the run.
#
# Environment: PYTHON (default python3) with cffi, pytest, hypothesis and psutil installed;
# KEEP=1 keeps the scratch directory.
set -euo pipefail

# shellcheck source=scripts/_scratch.sh
. "$(dirname "$0")/_scratch.sh"
cc="${CC:-gcc}"

libasan="$("$cc" -print-file-name=libasan.so)"
if [ ! -e "$libasan" ]; then
    echo "sanitize.sh: no ASan runtime for $cc (libasan.so not found)" >&2
    exit 2
fi
libasan="$(readlink -f "$libasan")"

scratch_setup sanitize

echo "== building the core with ASan+UBSan in $scratch"
start=$(date +%s)
BOUNDEDPROC_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -fno-wrapv -g -O1" \
    BOUNDEDPROC_LDFLAGS="-fsanitize=address,undefined" scratch_build

# The core and its supervisor program must really be instrumented, or the run below proves
# nothing.
for built in "$(ls "$scratch"/boundedproc/_bp*.so)" "$scratch/boundedproc/_bp_supervisor"; do
    if ! nm -D "$built" 2>/dev/null | grep '__asan_' >/dev/null; then
        echo "sanitize.sh: $built is not built with ASan" >&2
        exit 1
    fi
done

export LD_PRELOAD="$libasan${LD_PRELOAD:+:$LD_PRELOAD}"
# abort_on_error: a report kills the process, so pytest (or the child) cannot miss it.
# ASan reports go to files, one per process that reported: pytest or any child (children
# inherit the preload). UBSan ignores log_path inside the ASan runtime and writes to fd 2, so
# pytest captures only at the sys level (--capture=sys): a report reaches the terminal and
# the log below even when the process dies with it.
reports="$scratch/sanitizer-reports"
mkdir -p "$reports"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:allocator_may_return_null=1:log_path=$reports/asan${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export PYTHONDONTWRITEBYTECODE=1

cd "$scratch"
loaded="$("$python" -c 'import boundedproc._native as n; print(n._bp.__file__)')"
case "$loaded" in
    "$scratch"/*) ;;
    *) echo "sanitize.sh: the core was loaded from $loaded, not the sanitizer build" >&2; exit 1 ;;
esac

if [ "$#" -eq 0 ]; then
    set -- tests
fi
# Every child inherits LD_PRELOAD, and the ASan runtime reserves terabytes of address space
# for its shadow at startup, so a child under an RLIMIT_AS limit dies before main(): the
# memory-limit test cannot pass under ASan, whatever the core does.
set -- "$@" --deselect tests/test_contain.py::test_memory_limit
echo "== pytest $* (ASan+UBSan core, LD_PRELOAD=$libasan)"
status=0
"$python" -m pytest -p no:cacheprovider --capture=sys -q "$@" 2>&1 | tee "$scratch/pytest.log" ||
    status=$?  # pytest's (pipefail; tee itself succeeds)
found=$(grep -c 'runtime error:' "$scratch/pytest.log" || true)
stack_notes=0
for report in "$reports"/*; do
    [ -e "$report" ] || continue
    # A leader runs, until its exec, on a stack of its own that ASan does not know (the
    # core's child stack, csrc/spawn.c; the supervisor's leader_stack, csrc/supervisor.c):
    # before a noreturn call it says it ignores __asan_handle_no_return, and nothing more. A
    # report holding only that note is not a finding (bp_child_start unpoisons that stack
    # before each start, and after the exec when it waits for it); any other line is.
    if ! grep -v -e 'ASan is ignoring requested __asan_handle_no_return' \
            -e '^False positive error reports may follow' \
            -e '^For details see https://github.com/google/sanitizers/issues/189' \
            -e '^$' "$report" >/dev/null; then
        stack_notes=$((stack_notes + 1))
        continue
    fi
    found=$((found + 1))
    echo "---- $(basename "$report")"
    cat "$report"
done
echo "== sanitize.sh: pytest exit $status, $found sanitizer report(s)" \
     "($stack_notes that only note the leader's own stack before its exec)," \
     "$(( $(date +%s) - start )) s including the build"
if [ "$found" -gt 0 ] && [ "$status" -eq 0 ]; then
    status=1
fi
exit "$status"
