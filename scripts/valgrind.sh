#!/usr/bin/env bash
# Run representative run() calls under valgrind and say whether the C core leaks.
#
#   scripts/valgrind.sh            # exit 0: no loss record and no error touches the core
#
# The working tree is copied to a scratch directory and the core is built there with -g -O0,
# so valgrind's stacks name bp_ functions and csrc/ lines. CPython runs with PYTHONMALLOC=malloc
# so every allocation goes through valgrind. CPython itself leaks by design at exit, so the
# verdict reads only the records (leaks and memory errors) whose stack passes through the core:
# a bp_ symbol, the extension (_bp*.so) or a csrc/ file.
#
# Each kind of run (an echo, a deadline kill, a truncation, an overflow kill, a spawn failure,
# a payload, an unread payload, a cancel) is repeated ROUNDS times (default 20): a per-run leak
# then shows as a record of ROUNDS blocks, not one. Uncontained only: valgrind does not run a
# supervisor's start (clone with CLONE_VM | CLONE_VFORK | CLONE_FS, so that it shares the
# caller's cwd) and stopped the whole process there ("Unsupported clone() flags: 0x4311"), so
# boundedproc turns containment off where valgrind's preload is (containment_status() says so).
#
# Environment: PYTHON (default python3) with cffi installed; KEEP=1 keeps the scratch copy
# and the valgrind log.
set -euo pipefail

# shellcheck source=scripts/_scratch.sh
. "$(dirname "$0")/_scratch.sh"
rounds="${ROUNDS:-20}"

command -v valgrind >/dev/null || { echo "valgrind.sh: valgrind is not installed" >&2; exit 2; }

scratch_setup valgrind

start=$(date +%s)
echo "== building the core with -g -O0 in $scratch"
BOUNDEDPROC_CFLAGS="-g -O0 -fno-omit-frame-pointer" scratch_build

cat >"$scratch/drive.py" <<'EOF'
"""Representative runs, each kind ROUNDS times, every outcome checked."""
import sys

from boundedproc import Cancel, containment_status, run

rounds = int(sys.argv[1])
# Uncontained, the one mode under valgrind (see the header).
assert containment_status().startswith("unsupported under valgrind"), containment_status()
for _ in range(rounds):
    r = run(["echo", "hi"])
    assert r.ok and r.stdout == b"hi\n", r
    r = run(["sh", "-c", "sleep 5 & wait"], timeout=0.2)
    assert r.timed_out and r.exit_code == 124, r
    r = run(["head", "-c", "1000000", "/dev/zero"], max_output=1000)
    assert r.output_truncated and r.output_bytes == 1000000 and len(r.stdout) == 1000, r
    r = run(["head", "-c", "1000000", "/dev/zero"], max_output=1000, on_overflow="kill")
    assert r.output_truncated and r.exit_code == 137, r
    # valgrind runs the uncontained child (clone with CLONE_VM) as a copy of the process, so
    # the step it reports into our memory never arrives: the run reads as a command that
    # exited 127. Natively it is a spawn failure (the suite checks).
    r = run(["/bp/no/such/program"])
    assert r.exit_code == 127 and (not r.spawned or r.runner_error is None), r
    r = run(["cat"], stdin=b"x" * 200000, merge_stderr=True, text=True)
    assert r.ok and len(r.stdout) == 200000, r
    r = run(["true"], stdin=b"x" * 200000)
    assert not r.stdin_delivered, r
    c = Cancel()
    c.cancel()
    assert run(["true"], cancel=c).cancelled
print("drive.py: all runs as expected")
EOF

log="$scratch/valgrind.log"
echo "== valgrind --leak-check=full, $rounds rounds of 8 kinds of run"
cd "$scratch"
status=0
PYTHONMALLOC=malloc PYTHONDONTWRITEBYTECODE=1 valgrind \
    --leak-check=full --show-leak-kinds=definite,indirect,possible \
    --child-silent-after-fork=yes --trace-children=no --num-callers=40 \
    --log-file="$log" "$python" drive.py "$rounds" || status=$?
if [ "$status" -ne 0 ]; then
    echo "valgrind.sh: the driver failed (exit $status); see $log" >&2
    KEEP=1
    exit 1
fi

# Split the log into records (blank-line separated) and keep the ones whose stack passes
# through the core.
verdict=0
"$python" - "$log" "$(cd "$scratch/csrc" && ls -- *.c *.h)" <<'EOF' || verdict=$?
import re
import sys

text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
body = re.sub(r"^==\d+== ?", "", text, flags=re.M)
records = [r.strip() for r in body.split("\n\n") if r.strip()]
sources = "|".join(re.escape(name) for name in sys.argv[2].split())
# A bp_ function, a cffi wrapper of one (_cffi_f_bp_...), the extension, or a csrc/ file.
core = re.compile(r"\bbp_\w+|_cffi_f_\w+|/_bp[.\w-]*\.so|\b(?:" + sources + r"):\d+")
leaks = [r for r in records if "are definitely lost" in r or "are indirectly lost" in r
         or "are possibly lost" in r]
errors = [r for r in records if re.match(r"(Invalid|Conditional jump|Use of uninitialised|"
                                         r"Syscall param|Mismatched|Source and destination)", r)]
ours = [r for r in leaks + errors if core.search(r)]
summary = re.search(r"LEAK SUMMARY:.*?(?=\n\n|\Z)", body, re.S)
if "HEAP SUMMARY" not in body:
    sys.exit("valgrind.sh: the log has no heap summary: valgrind did not watch the interpreter")
print(f"valgrind: {len(leaks)} loss records and {len(errors)} error records in the whole "
      f"process (CPython's own included); {len(ours)} pass through the C core")
if summary:
    print(summary.group(0))
for r in ours:
    print("\n---- through the core:\n" + r)
sys.exit(1 if ours else 0)
EOF
echo "== valgrind.sh: $(( $(date +%s) - start )) s; $([ $verdict -eq 0 ] && echo 'no leak or error in the C core' || echo 'the C core leaks or errs')"
exit $verdict
