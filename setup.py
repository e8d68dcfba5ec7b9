"""Build the cffi extension and the supervisor program; all metadata lives in pyproject.toml."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import cffi  # noqa: F401
except ImportError:
    # Without cffi, setuptools would drop `cffi_modules` with a warning and build a pure
    # py3-none-any wheel that cannot import its core: refuse at once instead.
    sys.exit(
        "error: building boundedproc needs cffi (>=1.15): pip install cffi, or build without "
        "--no-build-isolation so pip fetches it"
    )

import setuptools

# pyproject.toml's license fields are PEP 639's, which older setuptools refuse with a long
# schema error; pip's isolated build fetches a new enough one, --no-build-isolation may not.
if int(setuptools.__version__.split(".")[0]) < 77:
    sys.exit(
        f"error: building boundedproc needs setuptools>=77 (this is {setuptools.__version__}): "
        "pip install -U setuptools, or build without --no-build-isolation"
    )

from setuptools import setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.join(HERE, "csrc"))
import build_ffi


def _check_compiler(compiler_type: str | None = None) -> None:
    """Exit with one line naming what to install when the C compiler is not there."""
    from distutils.ccompiler import new_compiler
    from distutils.sysconfig import customize_compiler

    install = ("install one (Debian/Ubuntu: apt-get install gcc; Fedora: dnf install gcc; "
               "macOS: xcode-select --install) or set CC to it")
    if "CC" in os.environ and not os.environ["CC"].strip():
        # The compiler's command would start with the first of the flags.
        sys.exit(f"error: building boundedproc needs a C compiler, and CC is set but empty: "
                 f"unset it, or {install}")
    cc = new_compiler(compiler=compiler_type)
    customize_compiler(cc)
    argv = getattr(cc, "compiler_so", None) or ["cc"]
    if shutil.which(argv[0]) is None:
        sys.exit(f"error: building boundedproc needs a C compiler, and {argv[0]!r} is not found: "
                 f"{install}")


class Build(build):
    """build that looks for the C compiler first, before any file is copied or generated."""

    def run(self) -> None:
        _check_compiler()
        super().run()


class BuildExt(build_ext):
    """build_ext that also links the supervisor program beside the extension."""

    def run(self) -> None:
        _check_compiler(self.compiler)
        super().run()
        out_dir = os.path.join(self.build_lib, "boundedproc")
        path = build_ffi.build_supervisor(self.compiler, self.build_temp, out_dir)
        if self.inplace or getattr(self, "editable_mode", False):
            package_dir = self.get_finalized_command("build_py").get_package_dir("boundedproc")
            self.copy_file(path, os.path.join(package_dir, build_ffi.SUPERVISOR))

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(),
                os.path.join(self.build_lib, "boundedproc", build_ffi.SUPERVISOR)]


def _limited_api() -> bool:
    # cffi builds for the stable ABI except on debug and free-threaded interpreters.
    return not (hasattr(sys, "gettotalrefcount") or sysconfig.get_config_var("Py_GIL_DISABLED"))


setup(
    cffi_modules=["csrc/build_ffi.py:ffibuilder"],
    cmdclass={"build": Build, "build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp310"}} if _limited_api() else {},
)
