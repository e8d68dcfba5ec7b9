#!/usr/bin/env bash
# run_cases.sh TIMEOUT_CMD [ARG]...
#
# The checks of coreutils' own timeout tests (tests/timeout/*.sh and
# timeout-blocked.pl in the coreutils repository), written again here as one
# case each, run against any timeout command:
#
#   tests/coreutils_timeout/run_cases.sh timeout
#   tests/coreutils_timeout/run_cases.sh python -m boundedproc.timeout
#   tests/coreutils_timeout/run_cases.sh 'python -m boundedproc.timeout'
#
# One line per case (PASS, FAIL with what was seen, or SKIP with why), then a
# total.  Exit status: 0 when no case failed, 1 otherwise, 2 for a usage error.
# The upstream file each case comes from is named in its id.  Where upstream
# depends on getlimits, the values are those of a 64-bit Linux (time_t and
# long double as on x86_64 and aarch64).
#
# The command must be runnable from any directory (for python -m, set
# PYTHONPATH); cases run in a fresh temporary directory, in the C locale.

set -u

if [ $# -eq 0 ]; then
  echo "usage: $0 TIMEOUT_CMD [ARG]..." >&2
  exit 2
fi
if [ $# -eq 1 ]; then
  read -r -a TO <<<"$1"   # one word holding the whole command: split it
else
  TO=("$@")
fi
TO_WORDS=$(printf '%q ' "${TO[@]}")   # for the scripts written below

export LC_ALL=C
unset TIMEOUT POSIXLY_CORRECT
work=$(mktemp -d "${TMPDIR:-/tmp}/coreutils_timeout.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 2

passed=0 failed=0 skipped=0

pass() { passed=$((passed + 1)); printf 'PASS  %s\n' "$1"; }
fail() { failed=$((failed + 1)); printf 'FAIL  %s: %s\n' "$1" "$2"; }
skip() { skipped=$((skipped + 1)); printf 'SKIP  %s: %s\n' "$1" "$2"; }

# status ID WANT ARG...: the command under test, run with ARG..., exits WANT.
status() {
  local id=$1 want=$2 got
  shift 2
  # (in braces: a shell's "Killed" report for it goes to /dev/null, too)
  { "${TO[@]}" "$@" </dev/null >/dev/null 2>"$work/err.$$"; } 2>/dev/null
  got=$?
  if [ "$got" = "$want" ]; then pass "$id"
  else fail "$id" "exit $got, expected $want ($(head -c 200 "$work/err.$$" | tr '\n' ' '))"
  fi
}

# status_not ID UNWANTED ARG...: ... exits with anything but UNWANTED (and not 125+).
status_not() {
  local id=$1 unwanted=$2 got
  shift 2
  { "${TO[@]}" "$@" </dev/null >/dev/null; } 2>/dev/null
  got=$?
  if [ "$got" != "$unwanted" ] && [ "$got" != 125 ]; then pass "$id ($got)"
  else fail "$id" "exit $got, expected anything but $unwanted (and 125)"
  fi
}

# wait_for FILE: poll up to about 10 s for FILE to appear.
wait_for() {
  local i
  for i in $(seq 100); do
    [ -e "$1" ] && return 0
    sleep .1
  done
  return 1
}

# --- timeout.sh: basic operation ------------------------------------------------

status "timeout.sh: a command that ends before 10s: its status" 0 10 true
status "timeout.sh: the d suffix" 0 1d true
status "timeout.sh: 0 is no deadline" 0 0 true
status "timeout.sh: the command's own status is kept" 2 10 sh -c 'exit 2'
status "timeout.sh: a deadline that fires: 124" 124 .1 sleep 10
status_not "timeout.sh: --preserve-status keeps the signal's status, not 124" 124 \
  --preserve-status .1 sleep 10
status_not "timeout.sh: -s0 -k1: the KILL after it is told (137), not 124" 124 \
  -s0 -k1 .1 sleep 10
status_not "timeout.sh: the same with --foreground" 124 --foreground -s0 -k1 .1 sleep 10

id="timeout.sh: a SIGCHLD ignored by the parent changes nothing"
( trap '' CHLD; exec "${TO[@]}" 10 true ) </dev/null >/dev/null 2>&1
got=$?
if [ $got = 0 ]; then pass "$id"; else fail "$id" "exit $got, expected 0"; fi

id="timeout.sh: started with a child already running (Bug#9098)"
out=$(sleep .1 & exec "${TO[@]}" .5 sh -c 'sleep 2; echo foo' 2>/dev/null </dev/null)
got=$?
if [ -z "$out" ] && [ $got = 124 ]; then pass "$id"
else fail "$id" "exit $got and output '$out', expected 124 and nothing"
fi

# The message names the program as it was run ("timeout", or the console
# script's own name); what follows the name is compared.
for opt in -v --verbose; do
  id="timeout.sh: $opt tells each signal sent, 0 as EXIT, then KILL"
  { "${TO[@]}" "$opt" -s0 -k .1 .1 sleep 10 </dev/null >/dev/null 2>"$work/errt"; } 2>/dev/null
  got=$(sed -e '/^Killed/d' -e 's/^[^:]*: //' "$work/errt")
  want=$(printf '%s\n' "sending signal EXIT to command 'sleep'" \
    "sending signal KILL to command 'sleep'")
  if [ "$got" = "$want" ]; then pass "$id"
  else fail "$id" "stderr was: $(tr '\n' '|' <"$work/errt")"
  fi
done

# --- timeout-parameters.sh: the command line ------------------------------------

status "timeout-parameters.sh: a duration that is no number: 125" 125 invalid sleep 0
status "timeout-parameters.sh: a negative duration: 125" 125 ' -0.1' sleep 0
status "timeout-parameters.sh: a negative duration that underflows: 125" 125 \
  ' -1e-10000' sleep 0
status "timeout-parameters.sh: a bad --kill-after: 125" 125 --kill-after=invalid 1 sleep 0
status "timeout-parameters.sh: an unknown unit (D): 125" 125 42D sleep 0
status "timeout-parameters.sh: a fraction" 0 10.34 sleep 0
status "timeout-parameters.sh: nanoseconds" 0 9.999999999 sleep 0
status "timeout-parameters.sh: a positive underflow is the smallest deadline, not 0" 124 \
  1e-10000 sleep 10
status "timeout-parameters.sh: a bad --signal: 125" 125 --signal=invalid 1 sleep 0
id="timeout-parameters.sh: a command that cannot be executed: 126"
env . >/dev/null 2>&1
if [ $? = 126 ]; then status "$id" 126 10 .
else skip "$id" "env . does not exit 126 here"
fi
status "timeout-parameters.sh: a command not found: 127" 127 10 no_such

# --- timeout-large-parameters.sh: durations past every limit ---------------------

TIME_T_OFLOW=9223372036854775808   # TIME_T_MAX + 1
UINT_OFLOW=4294967296              # UINT_MAX + 1
LDBL_MAX=1.18973149535723176502e+4932
status "timeout-large-parameters.sh: a time_t overflow is no immediate timeout" 0 \
  $TIME_T_OFLOW sleep 3
status "timeout-large-parameters.sh: past UINT_MAX" 0 $UINT_OFLOW sleep 0
status "timeout-large-parameters.sh: a time_t overflow of days" 0 ${TIME_T_OFLOW}d sleep 0
status "timeout-large-parameters.sh: 2.34e+5d" 0 2.34e+5d sleep 0
status "timeout-large-parameters.sh: LDBL_MAX (a double overflow)" 0 $LDBL_MAX sleep 0
status "timeout-large-parameters.sh: -LDBL_MAX after --: 125" 125 -- -$LDBL_MAX sleep 0
status "timeout-large-parameters.sh: 1e-5000 times out at once" 124 1e-5000 sleep 10

# --- timeout-group.sh: process groups --------------------------------------------

cat >timeout.cmd <<'EOF'
#!/bin/sh
trap 'touch int.received; exit' INT
touch timeout.running
count=$1
until test -e int.received || test $count = 0; do
  sleep 1
  count=$(expr $count - 1)
done
EOF
chmod +x timeout.cmd

id="timeout-group.sh: --foreground: a Ctrl-C to the caller's group reaches the command"
if ! setsid true 2>/dev/null; then
  skip "$id" "no setsid"
else
  cat >group.sh <<EOF
#!/bin/sh
echo \$\$ >group.pid
trap '' INT
$TO_WORDS --foreground 25 ./timeout.cmd 20 &
wait
EOF
  chmod +x group.sh
  rm -f int.received timeout.running group.pid
  setsid ./group.sh </dev/null >/dev/null 2>&1 &
  pid=$!
  if ! wait_for timeout.running; then
    fail "$id" "timeout.cmd did not start"
  else
    # group.sh leads its own session and group (setsid forks first when the
    # caller's child leads a group already, so $! may not be it).
    pgid=$(cat group.pid)
    kill -INT -- "-${pgid:-$pid}" 2>/dev/null
    wait $pid
    if [ -e int.received ]; then pass "$id"
    else fail "$id" "the command got no SIGINT"
    fi
  fi
  kill -KILL -- "-${pgid:-$pid}" 2>/dev/null
  wait 2>/dev/null
fi

id="timeout-group.sh: cascaded: the outer deadline's signal is sent on by the inner"
rm -f int.received timeout.running
start=$(date +%s)
"${TO[@]}" -sALRM 30 "${TO[@]}" -sINT 25 ./timeout.cmd 20 </dev/null >/dev/null 2>&1 &
pid=$!
if ! wait_for timeout.running; then
  fail "$id" "timeout.cmd did not start"
  kill -KILL $pid 2>/dev/null
  wait $pid 2>/dev/null
else
  kill -ALRM $pid
  wait $pid
  got=$?
  took=$(($(date +%s) - start))
  if [ $got = 124 ] && [ -e int.received ] && [ $took -lt 20 ]; then pass "$id"
  else fail "$id" "exit $got (expected 124), int.received: $([ -e int.received ] && echo yes || echo no), ${took}s"
  fi
fi

# --- timeout-blocked.pl: SIGALRM blocked by the parent ---------------------------

id="timeout-blocked.pl: a SIGALRM blocked by the parent still times out"
python=$(command -v python3 || command -v python)
if [ -z "$python" ]; then
  skip "$id" "no python to block SIGALRM with"
else
  "$python" -c '
import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
os.execvp(sys.argv[1], sys.argv[1:])
' "${TO[@]}" .1 sleep 10 </dev/null >/dev/null 2>&1
  got=$?
  if [ $got = 124 ]; then pass "$id"; else fail "$id" "exit $got, expected 124"; fi
fi

# --- init-parent.sh: init (pid 1) as the parent ----------------------------------

newpids() { unshare --pid --fork --map-root-user "$@"; }
if ! newpids true >/dev/null 2>&1; then
  skip "init-parent.sh: a command that ends in time" "unshare --pid --fork --map-root-user fails"
  skip "init-parent.sh: a deadline that fires: 124" "unshare --pid --fork --map-root-user fails"
else
  id="init-parent.sh: a command that ends in time"
  newpids "${TO[@]}" 10 sleep 2 </dev/null >/dev/null 2>"$work/err.$$"
  got=$?
  if [ $got = 0 ]; then pass "$id"
  else fail "$id" "exit $got, expected 0 ($(head -c 200 "$work/err.$$" | tr '\n' ' '))"
  fi
  id="init-parent.sh: a deadline that fires: 124"
  newpids "${TO[@]}" .1 sleep 10 </dev/null >/dev/null 2>"$work/err.$$"
  got=$?
  if [ $got = 124 ]; then pass "$id"
  else fail "$id" "exit $got, expected 124 ($(head -c 200 "$work/err.$$" | tr '\n' ' '))"
  fi
fi

total=$((passed + failed + skipped))
echo "total: $passed passed, $failed failed, $skipped skipped, of $total cases"
[ $failed = 0 ]
