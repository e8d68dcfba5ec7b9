"""The built package: the supervisor program beside the core, the console scripts, --version,
the distribution's metadata and what MANIFEST.in puts in the sdist."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import importable_env

import boundedproc
from boundedproc import _native


def test_supervisor_beside_the_core() -> None:
    """The build puts an executable _bp_supervisor in the directory of the loaded extension."""
    path = os.path.join(os.path.dirname(os.path.abspath(_native._bp.__file__)), "_bp_supervisor")
    assert os.path.isfile(path), f"{path} is not built"
    assert os.access(path, os.X_OK), f"{path} is not executable"


def _has_interpreter(path: str) -> bool:
    """Whether the ELF executable at ``path`` names a dynamic loader (a PT_INTERP header)."""
    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not a 64-bit LSB ELF"
    phoff = int.from_bytes(data[0x20:0x28], "little")
    size, count = (int.from_bytes(data[o:o + 2], "little") for o in (0x36, 0x38))
    return any(int.from_bytes(data[phoff + i * size:phoff + i * size + 4], "little") == 3
               for i in range(count))


@pytest.mark.skipif(not sys.platform.startswith("linux") or sys.maxsize < 2**32
                    or sys.byteorder != "little", reason="64-bit little-endian Linux ELF")
def test_supervisor_is_static_where_the_c_library_allows() -> None:
    """Linked statically where the static C library is there (it starts without the
    dynamic loader's work, about 0.1 ms sooner); dynamically under sanitizers, whose
    runtimes are shared libraries, or without libc.a."""
    path = os.path.join(os.path.dirname(os.path.abspath(_native._bp.__file__)), "_bp_supervisor")
    sanitized = b"__asan_init" in Path(path).read_bytes()
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    probe = subprocess.run([cc, "-print-file-name=libc.a"], capture_output=True, text=True,
                           check=False, timeout=60)
    if probe.returncode != 0 or not os.path.isabs(probe.stdout.strip()) or sanitized:
        pytest.skip("no static C library here, or a sanitizer build: linked dynamically")
    assert not _has_interpreter(path), f"{path} is dynamically linked"


BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "csrc" / "build_ffi.py"


@pytest.mark.skipif(not BUILD_SCRIPT.is_file() or not sys.platform.startswith("linux"),
                    reason="needs the source tree (csrc/), on Linux")
@pytest.mark.parametrize(("libc_a", "cflags", "links"), [
    (True, "", [["-pthread", "-static"]]),
    (False, "", [["-pthread", "-static"], ["-pthread"]]),
    (True, "-fsanitize=address", [["-pthread"]]),
], ids=["static", "no-libc.a-falls-back", "sanitizers-dynamic"])
def test_supervisor_link_static_or_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              libc_a: bool, cflags: str,
                                              links: list[list[str]]) -> None:
    """build_supervisor tries -static first (not under sanitizers) and, when that link
    fails (no libc.a), links dynamically instead of failing the build."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bp_build_ffi_under_test", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    build_ffi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_ffi)
    monkeypatch.setenv("BOUNDEDPROC_CFLAGS", cflags)
    monkeypatch.delenv("BOUNDEDPROC_LDFLAGS", raising=False)
    monkeypatch.delenv("BOUNDEDPROC_STATIC_SUPERVISOR", raising=False)
    tried: list[list[str]] = []

    class Compiler:
        def compile(self, *args: object, **kw: object) -> list[str]:
            return ["supervisor.o"]

        def link_executable(self, objects: list[str], name: str, output_dir: str,
                            extra_postargs: list[str]) -> None:
            tried.append(list(extra_postargs))
            if "-static" in extra_postargs and not libc_a:
                raise RuntimeError("cannot find -lc")  # as distutils' LinkError would

    out = build_ffi.build_supervisor(Compiler(), str(tmp_path), str(tmp_path))
    assert out == str(tmp_path / "_bp_supervisor")
    assert tried == links


@pytest.mark.parametrize("module", ["boundedproc", "grader"])
def test_version_flag(module: str) -> None:
    """`python -m boundedproc --version` and `python -m grader --version` print the version."""
    proc = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                          text=True, env=importable_env(), timeout=60, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0, f"boundedproc {boundedproc.__version__}\n", "")


@pytest.mark.parametrize("module", ["boundedproc", "boundedproc.timeout", "grader"])
def test_import_leaves_asyncio_out(module: str) -> None:
    """Importing the package (or starting the timeout(1) CLI) does not import asyncio, ssl
    and the rest: only run_async needs it, and its caller has it.  That is about a third of
    the CLI's start, and of the window in which a Ctrl-C ends it with a traceback."""
    code = f"import sys, {module}; print(sorted({{'asyncio', 'ssl'}} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=importable_env(), timeout=60, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "[]\n", "")


def test_console_scripts() -> None:
    """An installed distribution has the boundedproc and boundedproc-grade console scripts."""
    try:
        dist = importlib.metadata.distribution("boundedproc")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("boundedproc is not installed (an in-place build has no metadata)")
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts["boundedproc"] == "boundedproc.__main__:main"
    assert scripts["boundedproc-grade"] == "grader._cli:main"
    assert scripts["boundedproc-timeout"] == "boundedproc.timeout:main"


@pytest.mark.parametrize(("script", "banner"), [
    ("boundedproc", "boundedproc"),
    ("boundedproc-grade", "boundedproc"),
    ("boundedproc-timeout", "boundedproc-timeout (boundedproc)"),
])
def test_console_script_version(script: str, banner: str) -> None:
    """Each console script installed beside this Python runs and prints the version."""
    path = os.path.join(sysconfig.get_path("scripts"), script)
    if not os.access(path, os.X_OK):
        pytest.skip(f"{script} is not installed beside {sys.executable}")
    version = importlib.metadata.version("boundedproc")  # the script runs the installed package
    proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{banner} {version}\n", "")


@pytest.mark.parametrize(("module", "script"), [
    ("grader", "boundedproc-grade"), ("boundedproc", "boundedproc")])
def test_usage_names_the_command_as_it_was_run(module: str, script: str) -> None:
    """`--help` names `python -m MODULE` when run so, and the console script by its own
    name when run as that (not the `python -m` form, which that user did not type)."""
    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                          text=True, env=importable_env(), timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: python -m {module} ")
    path = os.path.join(sysconfig.get_path("scripts"), script)
    if not os.access(path, os.X_OK):
        pytest.skip(f"{script} is not installed beside {sys.executable}")
    proc = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: {script} "), proc.stdout


def test_metadata() -> None:
    """The installed metadata: MIT with its LICENSE, typed, Python 3.10 to 3.13 (SPEC 9.7)."""
    try:
        meta = importlib.metadata.metadata("boundedproc")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("boundedproc is not installed (an in-place build has no metadata)")
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["Requires-Python"] == ">=3.10"
    classifiers = set(meta.get_all("Classifier") or [])
    wanted = {"Typing :: Typed",
              *(f"Programming Language :: Python :: 3.{minor}" for minor in range(10, 14))}
    assert wanted <= classifiers, wanted - classifiers


def _manifest_files(manifest: Path) -> set[str]:
    """The files under the current directory that setuptools' reading of manifest takes."""
    egg_info = pytest.importorskip("setuptools.command.egg_info")
    files = egg_info.FileList()
    files.findall()  # relative names, as the patterns are
    for line in manifest.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            files.process_template_line(line)
    return set(files.files)


def test_sdist_takes_sources_and_no_caches(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """MANIFEST.in takes the build and test sources, not build products or tool caches."""
    manifest = Path(__file__).resolve().parent.parent / "MANIFEST.in"
    if not manifest.is_file():
        pytest.skip("not run from a source tree: no MANIFEST.in beside tests/")
    wanted = {"LICENSE", "README.md", "CHANGELOG.md", "mkdocs.yml", "csrc/build_ffi.py", "csrc/bp.h",
              "csrc/spawn.c", "boundedproc/py.typed", "boundedproc/_bp.pyi", "grader/py.typed",
              "tests/conftest.py", "tests/typing/user_code.py", "examples/claims.jsonl",
              "benchmarks/floor.c", "docs/index.md"}
    unwanted = {"boundedproc/_bp.c", "boundedproc/_bp_supervisor", "boundedproc/_bp.abi3.so",
                "csrc/spawn.o", "tests/__pycache__/conftest.cpython-311-pytest-8.pyc",
                "tests/.hypothesis/examples/0a/1b", "tests/.pytest_cache/v/cache/lastfailed",
                "tests/typing/.mypy_cache/3.11/user_code.data.json",
                "examples/humaneval/.ruff_cache/0.6.0/123"}
    for name in wanted | unwanted:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    monkeypatch.chdir(tmp_path)
    assert _manifest_files(manifest) == wanted


@pytest.mark.parametrize("cc", ["", "  ", "/nonexistent/cc"])
def test_a_build_without_a_usable_compiler_says_what_to_install(cc: str) -> None:
    """``CC`` set to no compiler fails the build at once, with what to install.  An empty
    ``CC`` named the first compiler flag as the compiler that was not found."""
    setup = Path(__file__).resolve().parent.parent / "setup.py"
    if not setup.exists():
        pytest.skip("not a source tree")
    try:
        from setuptools import __version__ as setuptools_version
    except ImportError:
        pytest.skip("no setuptools here")
    if int(setuptools_version.split(".")[0]) < 77:
        pytest.skip("setup.py needs setuptools>=77")
    done = subprocess.run([sys.executable, str(setup), "-q", "build"], cwd=setup.parent,
                          env={**os.environ, "CC": cc}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode != 0
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: building boundedproc needs a C compiler, and "), done.stderr
    assert "apt-get install gcc" in line
    assert ("CC is set but empty" if not cc.strip() else repr(cc)) in line, line
