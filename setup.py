"""Build the cffi extension and the containment supervisor.

All metadata lives in pyproject.toml.  The supervisor (csrc/supervisor.c) is
a small program, not a module: it is compiled with the same compiler as the
extension and installed inside the package as ``boundedproc/_bp_supervisor``.
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc"))
from build_ffi import build_supervisor  # noqa: E402


class BuildExtWithSupervisor(build_ext):
    """build_ext, plus the supervisor executable beside the extension."""

    def run(self) -> None:
        super().run()
        out_dir = "boundedproc" if self.inplace else os.path.join(self.build_lib, "boundedproc")
        os.makedirs(out_dir, exist_ok=True)
        build_supervisor(out_dir, self.compiler, self.build_temp)


setup(
    cffi_modules=["csrc/build_ffi.py:ffibuilder"],
    cmdclass={"build_ext": BuildExtWithSupervisor},
)
