# Shared by sanitize.sh and valgrind.sh (sourced, not run): a scratch copy of the working tree
# with the core (extension and supervisor program) built in place under the caller's
# BOUNDEDPROC_CFLAGS/LDFLAGS.
#
# After `scratch_setup NAME`: $here is the checkout, $python the real interpreter (not a pyenv
# shim that would hide it), $scratch the copy, removed at exit unless KEEP=1.

scratch_setup() {
    local name="$1"
    here="$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)"
    python="${PYTHON:-python3}"
    python="$("$python" -c 'import sys; print(sys.executable)')"
    scratch="$(mktemp -d "${TMPDIR:-/tmp}/bp-$name.XXXXXX")"
    _scratch_name="$name"
    trap _scratch_cleanup EXIT
    # The working tree as it is (tracked and untracked), without anything git ignores.
    (cd "$here" && git ls-files -z --cached --others --exclude-standard) |
        (cd "$here" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) |
        (cd "$here" && tar --null -T - -cf -) | (cd "$scratch" && tar -xf -)
}

_scratch_cleanup() {
    if [ "${KEEP:-}" = 1 ]; then
        echo "$_scratch_name.sh: kept $scratch" >&2
    else
        rm -rf "$scratch"
    fi
}

# Build the core in the copy with the BOUNDEDPROC_* flags already exported by the caller.
scratch_build() {
    (
        cd "$scratch"
        "$python" csrc/build_ffi.py >/dev/null 2>build.log || { cat build.log >&2; exit 1; }
        rm -f boundedproc/_bp.o csrc/*.o
    )
}
