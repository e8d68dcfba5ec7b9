"""Smoke test of the compiled core: structs, constants and version."""

from __future__ import annotations

import boundedproc
from boundedproc import _native
from boundedproc._bp import ffi, lib


def test_structs_allocate() -> None:
    """Every struct of the header can be allocated and is zeroed."""
    spec = ffi.new("struct bp_spec *")
    res = ffi.new("struct bp_result *")
    handle = ffi.new("struct bp_run **")
    assert spec.cancel_fd == 0 and res.exit_code == 0 and handle[0] == ffi.NULL
    assert ffi.sizeof("struct bp_spec") > 0 and ffi.sizeof("struct bp_result") > 0


def test_constants_match_the_header() -> None:
    """The exported exit codes come from the C header and equal the spec's values."""
    assert boundedproc.DEADLINE_EXIT_CODE == lib.BP_DEADLINE_EXIT_CODE == 124
    assert boundedproc.CANCEL_EXIT_CODE == lib.BP_CANCEL_EXIT_CODE == 137
    assert boundedproc.SPAWN_FAILURE_EXIT_CODE == lib.BP_SPAWN_FAILURE_EXIT_CODE == 127


def test_compiled_version_matches_package() -> None:
    """The version compiled into the core is the package's version."""
    assert _native.core_version() == boundedproc.__version__


def test_free_accepts_null() -> None:
    """bp_free(NULL) and bp_abort(NULL) are no-ops, not crashes."""
    lib.bp_free(ffi.NULL)
    lib.bp_abort(ffi.NULL)


def _chunk_spec(argv: list[bytes], keep: list[object], max_output: int) -> object:
    """A bp_spec for an uncontained run of argv with report_chunks set; `keep` holds its memory."""
    spec = ffi.new("struct bp_spec *")
    for name, items in (("argv", argv), ("exec_paths", argv[:1])):
        strings = [ffi.new("char[]", item) for item in items]
        array = ffi.new("char *[]", [*strings, ffi.NULL])
        keep.extend([*strings, array])
        setattr(spec, name, array)
    spec.envp = ffi.NULL
    spec.timeout_ns = 30 * 10**9
    spec.max_output = max_output
    spec.keep = lib.BP_KEEP_HEAD
    spec.report_chunks = 1
    spec.cancel_fd = spec.cancel_fd2 = spec.wake_fd = -1
    spec.stdin_fd = spec.stdout_fd = spec.stderr_fd = -1
    spec.drain_grace_ns = 2 * 10**9
    spec.first_signal = 15
    spec.new_session = 1
    spec.uid = spec.gid = -1
    spec.ngroups = -1
    for i in range(len(spec.rlimits_soft)):
        spec.rlimits_soft[i] = spec.rlimits_hard[i] = -1
    return spec


def test_chunks_are_reported_and_handed_over() -> None:
    """report_chunks: BP_CHUNK per read, and bp_chunk hands over every byte, kept or not."""
    keep: list[object] = []
    script = b"printf abc; sleep 0.2; printf defgh >&2; sleep 0.2; printf ij"
    spec = _chunk_spec([b"/bin/sh", b"-c", script], keep, max_output=4)
    res = ffi.new("struct bp_result *")
    handle = ffi.new("struct bp_run **")
    stream, ptr, length = ffi.new("int *"), ffi.new("const unsigned char **"), ffi.new("size_t *")
    chunks: list[tuple[int, bytes]] = []
    try:
        assert lib.bp_start(spec, res, ffi.NULL, handle) == 0 and res.spawned
        run = handle[0]
        assert lib.bp_chunk(run, stream, ptr, length) == -1  # no BP_CHUNK yet
        while True:
            rc = lib.bp_wait(run)
            if rc == lib.BP_CHUNK:
                assert lib.bp_chunk(run, stream, ptr, length) == 0
                assert length[0] > 0
                chunks.append((stream[0], bytes(ffi.buffer(ptr[0], length[0]))))
            elif rc == lib.BP_DONE:
                break
            else:
                assert rc == lib.BP_AGAIN, (rc, res.err_stage, res.err_errno)
        assert lib.bp_chunk(run, stream, ptr, length) == -1  # the last call returned BP_DONE
        kept = bytearray(res.stdout_len)
        assert lib.bp_take_output(run, lib.BP_STDOUT, ffi.from_buffer(kept), len(kept)) == 0
    finally:
        lib.bp_free(handle[0])
    joined = {s: b"".join(c for t, c in chunks if t == s) for s in (lib.BP_STDOUT, lib.BP_STDERR)}
    assert joined == {lib.BP_STDOUT: b"abcij", lib.BP_STDERR: b"defgh"}
    order = [s for i, (s, _) in enumerate(chunks) if i == 0 or chunks[i - 1][0] != s]
    assert order == [lib.BP_STDOUT, lib.BP_STDERR, lib.BP_STDOUT]  # arrival order, 0.2 s apart
    assert (res.exit_code, res.stdout_read, res.stderr_read) == (0, 5, 5)
    assert bytes(kept) == b"abc" and res.stderr_len == 1 and res.output_truncated
