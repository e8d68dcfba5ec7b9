"""cffi build script for the C core (API, out-of-line mode).

Kept outside the package, as pyca/cryptography does: setup.py names it in
``cffi_modules`` and it produces the extension ``boundedproc._bp``.  The cdef is
the public header itself, so the declarations live in one place.

It also builds the containment supervisor, a small executable
(``boundedproc/_bp_supervisor``, beside the extension) from ``SUPERVISOR_SOURCES``,
with the same compiler and flags (linked statically where it can be, see
``_static_supervisor``): setup.py's ``build_ext`` calls
``build_supervisor`` for ``pip install``, and running this file builds both in place
(``python csrc/build_ffi.py``).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from typing import Any

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCES = ["spawn.c", "loop.c", "output.c", "kill.c", "proc.c", "sup.c", "batch.c"]
SUPERVISOR_SOURCES = ["supervisor.c", "proc.c"]
SUPERVISOR = "_bp_supervisor"


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


def _ldflags() -> list[str]:
    return ["-pthread"] + os.environ.get("BOUNDEDPROC_LDFLAGS", "").split()


def _macros() -> list[tuple[str, str]]:
    return [("BP_VERSION", f'"{_version()}"'), ("_GNU_SOURCE", "1")]


def build_supervisor(compiler: Any, build_temp: str, out_dir: str) -> str:
    """Compile and link the supervisor program into out_dir; return its path.

    compiler is a distutils ``CCompiler`` already customised for this Python (the
    one ``build_ext`` built the extension with), so both get the same compiler and
    base flags; the objects go under build_temp.
    """
    objects = compiler.compile(
        [os.path.join(HERE, name) for name in SUPERVISOR_SOURCES],
        output_dir=os.path.join(build_temp, "supervisor"),
        macros=_macros(),
        include_dirs=[HERE],
        extra_postargs=_cflags(),
    )
    if _static_supervisor():
        try:
            compiler.link_executable(objects, SUPERVISOR, output_dir=out_dir,
                                     extra_postargs=[*_ldflags(), "-static"])
            return os.path.join(out_dir, SUPERVISOR)
        except Exception:  # noqa: BLE001  distutils' LinkError, from stdlib or setuptools
            print("boundedproc: no static C library here (libc.a, e.g. glibc-static); "
                  "linking the supervisor dynamically")
    compiler.link_executable(objects, SUPERVISOR, output_dir=out_dir, extra_postargs=_ldflags())
    return os.path.join(out_dir, SUPERVISOR)


def _static_supervisor() -> bool:
    """Whether to try linking the supervisor statically.

    A supervisor is started for each calling thread and for each worker of a
    run_many call; without the dynamic loader's work it starts about 0.1 ms
    sooner (a thread that runs one contained command and ends: 1.04 -> 0.90 ms;
    a contained run_many of 4 commands: 2.1 -> 1.75 ms; benchmarks/README.md),
    and no LD_PRELOAD of the caller's reaches it.  Linux only (where it exists),
    never with sanitizers (their runtimes are shared libraries), and
    ``BOUNDEDPROC_STATIC_SUPERVISOR=0`` turns it off.  Where the static C library
    is missing, the link falls back to a dynamic one.
    """
    if not sys.platform.startswith("linux"):
        return False
    if os.environ.get("BOUNDEDPROC_STATIC_SUPERVISOR", "1") == "0":
        return False
    flags = " ".join([*_cflags(), *_ldflags()])
    return "-fsanitize" not in flags


ffibuilder = FFI()
with open(os.path.join(HERE, "boundedproc.h"), encoding="utf-8") as _f:
    ffibuilder.cdef(_f.read())

ffibuilder.set_source(
    "boundedproc._bp",
    '#include "bp_internal.h"\n',
    # Relative for setup.py (setuptools refuses absolute paths in setup() arguments); the
    # in-place build below compiles in a temporary directory, so it needs them absolute.
    sources=[os.path.join(HERE if __name__ == "__main__" else "csrc", name) for name in SOURCES],
    include_dirs=[HERE],
    define_macros=_macros(),
    extra_compile_args=_cflags(),
    extra_link_args=_ldflags(),
)

if __name__ == "__main__":
    # In-place development build: boundedproc/_bp*.so and boundedproc/_bp_supervisor. Both are
    # built in a temporary directory, where cffi's distutils run reads no pyproject.toml (a
    # setuptools older than the one pyproject asks for would refuse its license fields), then
    # moved into place with a rename, so a process that has the old files open keeps them.
    # setuptools first: it provides distutils on 3.12+.
    import setuptools  # noqa: F401, I001
    from distutils.ccompiler import new_compiler
    from distutils.sysconfig import customize_compiler

    package = os.path.join(ROOT, "boundedproc")
    # Inside the checkout, so the rename below stays on one filesystem.
    with tempfile.TemporaryDirectory(prefix=".build-", dir=ROOT) as tmp:
        built = [ffibuilder.compile(tmpdir=tmp, verbose=False)]
        cc = new_compiler()
        customize_compiler(cc)
        built.append(build_supervisor(cc, tmp, tmp))
        for path in built:
            os.replace(path, os.path.join(package, os.path.basename(path)))
