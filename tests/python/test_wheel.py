"""The wheel works on its own: built from this tree (reusing build/python, so an unchanged
tree rebuilds nothing) and installed into a fresh virtual environment that sees neither
the development install nor any site-packages but NumPy, it imports and computes, its
`attn` command behaves as the built tools/attn, and every shared library the extension
and the command load resolves inside the wheel or to Debian's base runtime.

Debian's base runtime: the libraries of the packages that dpkg (Essential) and apt
(required) depend on, so that every Debian 12 system has them: libc6 (libc, libm,
libmvec, the loader, and the libpthread/libdl/librt stubs), libgcc-s1, libstdc++6 and
zlib1g; the manylinux policies allow the same ones. Everything else (libhwy1, libgomp1,
libpng16-16, libfreetype6 and libbrotli1, which a slim Debian lacks) must come from the wheel. The same list is in
python/CMakeLists.txt, which picks what the wheel carries. The one exception is MPI:
attn._dist (attn.dist) links the system's libmpi, the one mpi4py uses, so neither libmpi
nor anything it needs may be in the wheel; `import attn` and the command never load it.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_DIR = REPO / "build" / "python"
BASE_RUNTIME = {
    "linux-vdso.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "libc.so.6",
    "libm.so.6", "libmvec.so.1", "libpthread.so.0", "libdl.so.2", "librt.so.1",
    "libstdc++.so.6", "libgcc_s.so.1", "libz.so.1",
}
# What the wheel must carry itself: Highway above all (Debian has no static libhwy.a).
BUNDLED = ("libhwy.so.1", "libgomp.so.1", "libpng16.so.16", "libfreetype.so.6",
           "libbrotlidec.so.1", "libbrotlicommon.so.1")

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not shutil.which("ldd") or not shutil.which("readelf"),
    reason="checks ELF dependencies with ldd and readelf (Linux)",
)


def _run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result


def _clean_environment():
    """The environment of a user's shell: nothing that points at this tree or its venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _kept_defines():
    """The options build/python was configured with (make install-python's ATTN_WERROR and
    generator), so that building the wheel there changes no flag and recompiles nothing."""
    cache = BUILD_DIR / "CMakeCache.txt"
    text = cache.read_text() if cache.exists() else ""
    kept = []
    for name, pattern in (("ATTN_WERROR", r"^ATTN_WERROR:BOOL=(\w+)$"),
                          ("CMAKE_GENERATOR", r"^CMAKE_GENERATOR:(?:INTERNAL|UNINITIALIZED)=(.+)$")):
        found = re.search(pattern, text, re.M)
        if found:
            kept += ["-C", f"cmake.define.{name}={found.group(1)}"]
    return kept


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
          "--no-build-isolation", "-C", f"build-dir={BUILD_DIR}", *_kept_defines(),
          "-w", str(dist), str(REPO)])
    (path,) = dist.glob("attn-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv (no system site-packages) with the wheel installed by pip, offline. Its
    one other package, NumPy, is this environment's, seen through a folder that holds
    NumPy alone (a .pth file), so pip finds the dependency satisfied."""
    root = tmp_path_factory.mktemp("venv")
    venv_dir = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv_dir)], env=_clean_environment())
    numpy_only = root / "numpy-only"
    numpy_only.mkdir()
    numpy_home = Path(np.__file__).resolve().parents[1]
    for entry in numpy_home.iterdir():
        if entry.name == "numpy" or re.fullmatch(r"numpy(\.libs|-[^-]+\.dist-info)", entry.name):
            (numpy_only / entry.name).symlink_to(entry)
    python = venv_dir / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     env=_clean_environment()).stdout.strip())
    (site / "numpy-only.pth").write_text(f"{numpy_only}\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
          "--disable-pip-version-check", "--no-index", str(wheel)],
         env=_clean_environment())
    return venv_dir


def _python(venv, code):
    return _run([str(venv / "bin" / "python"), "-c", code], env=_clean_environment(), cwd=venv)


def _package_dir(venv):
    return Path(_python(venv, "import attn, os; print(os.path.dirname(attn.__file__))").stdout.strip())


def test_the_wheel_holds_the_extension_the_command_and_the_libraries(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (script,) = [n for n in names if re.fullmatch(r"attn-[^/]+\.data/scripts/attn", n)]
        shebang = archive.read(script).decode().splitlines()[0]
    assert "attn/bin/attn" in names
    assert any(re.fullmatch(r"attn/_attn\..*\.so", n) for n in names)
    assert any(re.fullmatch(r"attn/_dist\..*\.so", n) for n in names)
    assert not [n for n in names if re.match(r"attn/lib/libmpi", n)]
    for library in BUNDLED:
        assert f"attn/lib/{library}" in names
    assert shebang == "#!python"  # pip writes the environment's interpreter there


def test_import_and_compute_from_the_fresh_venv(venv):
    out = _python(venv, (
        "import os, sys, numpy as np, attn\n"
        "print(os.path.dirname(attn.__file__))\n"
        "q, k, v = np.random.default_rng(0).standard_normal((3, 2, 5, 8)).astype(np.float32)\n"
        "s = q @ k.transpose(0, 2, 1) / np.sqrt(8)\n"
        "s[:, np.triu_indices(5, 1)[0], np.triu_indices(5, 1)[1]] = -np.inf\n"
        "w = np.exp(s - s.max(-1, keepdims=True)); w /= w.sum(-1, keepdims=True)\n"
        "print(np.abs(attn.attention(q, k, v, causal=True) - w @ v).max())\n"
    )).stdout.split("\n")
    assert Path(out[0]).is_relative_to(venv), f"attn imported from {out[0]}, not the fresh venv"
    assert float(out[1]) < 1e-5


def _built_command():
    command = BUILD_DIR / "tools" / "attn"
    assert command.is_file(), f"{command}: the build the wheel came from has no attn command"
    return command


@pytest.mark.parametrize("arguments", [["--help"], ["demo"], ["run", "--help"],
                                       ["run", "--query", "missing.npy"], ["nonsense"]])
def test_the_attn_command_behaves_as_tools_attn(venv, tmp_path, arguments):
    """The same output, errors and exit status as the program built from tools/ (the
    name it was started by aside: the console script passes its own, as a shell would)."""
    installed = venv / "bin" / "attn"
    got = subprocess.run([str(installed), *arguments], capture_output=True, text=True,
                         env=_clean_environment(), cwd=tmp_path, timeout=300)
    want = subprocess.run([str(_built_command()), *arguments], capture_output=True, text=True,
                          env=_clean_environment(), cwd=tmp_path, timeout=300)
    assert got.returncode == want.returncode, got.stderr
    assert got.returncode in (0, 2)
    def comparable(text, program):  # the name started by, and the demo's measured times
        return re.sub(r"[0-9.]+ (ms|GFLOP/s)\b", r"<n> \1", text.replace(str(program), "attn"))

    for stream in ("stdout", "stderr"):
        mine = comparable(getattr(got, stream), installed)
        theirs = comparable(getattr(want, stream), _built_command())
        assert mine == theirs, stream
    if arguments == ["--help"]:
        assert "demo" in got.stdout and "run" in got.stdout


def test_the_attn_command_starts_without_importing_the_package(venv):
    """The script in bin/ finds the package without importing it (and NumPy with it)."""
    env = {**_clean_environment(), "PYTHONPROFILEIMPORTTIME": "1"}
    result = subprocess.run([str(venv / "bin" / "attn"), "--help"], capture_output=True,
                            text=True, env=env, timeout=60)
    assert result.returncode == 0 and "import time:" in result.stderr
    assert not re.search(r"\b(numpy|attn)\b", result.stderr), result.stderr


def _ldd(path):
    """{soname: resolved path or None} of every library the loader brings in for path."""
    result = _run(["ldd", str(path)], env=_clean_environment())
    libraries = {}
    for line in result.stdout.splitlines():
        line = line.strip()
        if "=>" in line:
            name, where = (part.strip() for part in line.split("=>", 1))
            libraries[name] = None if where.startswith("not found") else where.split(" (")[0]
        elif line:
            path_or_name = line.split(" (")[0]
            libraries[os.path.basename(path_or_name)] = path_or_name
    return libraries


def _needed_and_runpath(path):
    dynamic = _run(["readelf", "-d", str(path)], env={"LC_ALL": "C", "PATH": os.environ["PATH"]}).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", dynamic)
    runpath = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[(.+)\]", dynamic)
    return needed, runpath


def test_every_shared_library_resolves_inside_the_wheel_or_to_the_base_runtime(venv):
    package = _package_dir(venv)
    (extension,) = package.glob("_attn*.so")
    bundled_dir = (package / "lib").resolve()
    for binary in (extension, package / "bin" / "attn"):
        libraries = _ldd(binary)
        missing = sorted(name for name, where in libraries.items() if where is None)
        assert not missing, f"{binary}: not found: {missing}"
        for name, where in libraries.items():
            inside = Path(where).resolve().is_relative_to(bundled_dir)
            assert inside or name in BASE_RUNTIME, (
                f"{binary.name}: {name} resolves to {where}, outside the wheel and not part of "
                f"Debian's base runtime")
            if name in BUNDLED:
                assert inside, f"{binary.name}: {name} resolves to {where}, not to the wheel's copy"
        assert "libhwy.so.1" in libraries
    for library in bundled_dir.iterdir():
        needed, _ = _needed_and_runpath(library)
        outside = [n for n in needed if n not in BASE_RUNTIME and not (bundled_dir / n).exists()]
        assert not outside, f"{library.name} needs {outside}, neither bundled nor base runtime"
    assert _needed_and_runpath(extension)[1] == ["$ORIGIN/lib"]
    assert _needed_and_runpath(package / "bin" / "attn")[1] == ["$ORIGIN/../lib"]


def test_the_mpi_extension_takes_mpi_from_the_system(venv):
    """attn._dist: libmpi, and only libmpi and what it needs, from outside the wheel (the
    system's, as for mpi4py); none of that in attn/lib; the rest as for attn._attn."""
    package = _package_dir(venv)
    (extension,) = package.glob("_dist*.so")
    bundled_dir = (package / "lib").resolve()
    libraries = _ldd(extension)
    missing = sorted(name for name, where in libraries.items() if where is None)
    assert not missing, f"{extension.name}: not found: {missing}"
    (libmpi,) = [where for name, where in libraries.items() if name.startswith("libmpi.so")]
    assert not Path(libmpi).resolve().is_relative_to(bundled_dir)
    mpi_libraries = ({Path(libmpi).name} | set(_ldd(libmpi))) - BASE_RUNTIME
    for name, where in libraries.items():
        inside = Path(where).resolve().is_relative_to(bundled_dir)
        assert inside or name in BASE_RUNTIME or name in mpi_libraries, (
            f"{extension.name}: {name} resolves to {where}, outside the wheel, not part of "
            f"Debian's base runtime and not MPI's")
        if name in BUNDLED:
            assert inside, f"{extension.name}: {name} resolves to {where}, not to the wheel's copy"
    carried = sorted(name for name in mpi_libraries if (bundled_dir / name).exists())
    assert not carried, f"the wheel carries MPI's libraries {carried}"
    assert _needed_and_runpath(extension)[1] == ["$ORIGIN/lib"]


def test_the_fresh_venv_imports_attn_dist_up_to_mpi4py(venv):
    """attn._dist loads (the system's libmpi); attn.dist then asks for mpi4py, which the
    fresh venv lacks."""
    out = _python(venv, (
        "import attn._dist, sys\n"
        "print('mpi4py' in sys.modules)\n"
        "try:\n    import attn.dist\nexcept ImportError as error:\n    print(error)\n"
    )).stdout.splitlines()
    assert out[0] == "False"
    assert out[1].startswith("attn.dist needs mpi4py"), out


def test_the_fresh_venv_sees_no_development_install(venv):
    paths = _python(venv, "import sys; print('\\n'.join(sys.path))").stdout.split()
    development = Path(sysconfig.get_path("purelib")).resolve()
    assert not any(Path(p).resolve() == development for p in paths if p), paths
    assert _python(venv, "import importlib.util as u; print(u.find_spec('torch'))").stdout.strip() == "None"


def _system_copies():
    """The files this machine's loader would take BUNDLED's libraries from (ldconfig's cache)."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    found = re.findall(r"^\s*(\S+) \(([^)]*)\) => (\S+)$", listing, re.M)
    return sorted({os.path.realpath(path) for name, _, path in found if name in BUNDLED})


def test_the_wheel_works_with_the_systems_copies_hidden(venv):
    """As on a machine without libhwy1, libgomp1, libpng16-16, libfreetype6 and libbrotli1:
    in a private mount namespace (root only), the system's copies read as empty files; the
    program built in build/python then fails to start, and the wheel's import and command
    still work."""
    hidden = _system_copies()
    unshare = shutil.which("unshare")
    if not hidden or not unshare or subprocess.run([unshare, "-m", "true"], capture_output=True).returncode:
        pytest.skip("needs the system's copies to hide and a mount namespace (unshare -m, root)")
    script = "\n".join([
        "set -e",
        *(f"mount --bind /dev/null '{path}'" for path in hidden),
        f"if '{_built_command()}' --help >/dev/null 2>&1; then echo 'not hidden'; exit 3; fi",
        f"'{venv}/bin/attn' demo >/dev/null",
        f"'{venv}/bin/python' -c 'import attn, numpy as np; q = np.ones((3, 8), np.float32); "
        "assert np.allclose(attn.attention(q, q, q), q)'",
    ])
    _run([unshare, "-m", "sh", "-c", script], env=_clean_environment())
