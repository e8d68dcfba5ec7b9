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
