"""cffi build script for the C core (API, out-of-line mode).

Kept outside the package, as pyca/cryptography does: setup.py names it in
``cffi_modules`` and it produces the extension ``boundedproc._bp``.  The cdef is
the public header itself, so the declarations live in one place.
"""

from __future__ import annotations

import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCES = ["spawn.c", "loop.c", "kill.c", "contain.c"]


def _version() -> str:
    with open(os.path.join(ROOT, "boundedproc", "_version.py"), encoding="utf-8") as f:
        match = re.search(r'__version__\s*=\s*"([^"]+)"', f.read())
    if match is None:
        raise RuntimeError("boundedproc/_version.py has no __version__")
    return match.group(1)


def _cflags() -> list[str]:
    flags = ["-std=c11", "-Wall", "-Wextra", "-Wconversion", "-pthread"]
    if os.environ.get("BOUNDEDPROC_WERROR"):
        flags.append("-Werror")
    extra = os.environ.get("BOUNDEDPROC_CFLAGS")
    if extra:
        flags.extend(extra.split())
    return flags


ffibuilder = FFI()
with open(os.path.join(HERE, "boundedproc.h"), encoding="utf-8") as _f:
    ffibuilder.cdef(_f.read())

ffibuilder.set_source(
    "boundedproc._bp",
    '#include "bp_internal.h"\n',
    sources=[os.path.join("csrc", name) for name in SOURCES],
    include_dirs=[HERE],
    define_macros=[("BP_VERSION", f'"{_version()}"'), ("_GNU_SOURCE", "1")],
    extra_compile_args=_cflags(),
    extra_link_args=["-pthread"] + (os.environ.get("BOUNDEDPROC_LDFLAGS", "").split()),
)

if __name__ == "__main__":
    # In-place development build: boundedproc/_bp*.so
    os.chdir(ROOT)
    ffibuilder.compile(verbose=False)
