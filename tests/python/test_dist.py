"""attn.dist: tests/python/mpi/ under mpirun on 1 to 4 ranks, one pytest per rank (mpirun
fails when any rank fails; the timeout turns a hang into a failure, with what the ranks
printed). The environment is tests/CMakeLists.txt's for the C++ dist_ranks tests: one
thread per rank and MPI's idle yield keep 4 ranks workable on a 2-core machine, and the
single-copy mechanism (CMA) is refused inside some containers. Then, in processes of their
own without mpirun: `import attn` loads no MPI, and `import attn.dist` says what is missing."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MPI_TESTS = Path(__file__).resolve().parent / "mpi"
MPI_ENVIRONMENT = {
    "ATTN_NUM_THREADS": "1",
    "OMPI_MCA_mpi_yield_when_idle": "1",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
}
TIMEOUT_SECONDS = 120


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_attn_dist_on_every_rank(ranks):
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun: not found; scripts/install-deps.sh (make deps) installs Open MPI"
    command = [mpirun, "-np", str(ranks), "--oversubscribe", "--allow-run-as-root",
               "--bind-to", "none", sys.executable, "-m", "pytest", "-q", "--color=no",
               "-p", "no:cacheprovider", str(MPI_TESTS)]
    # A session of its own, so that a hang ends with mpirun and every rank it started.
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           cwd=REPO, env={**os.environ, **MPI_ENVIRONMENT},
                           start_new_session=True)
    try:
        output, _ = job.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGTERM)  # mpirun passes it on to the ranks
        try:
            output, _ = job.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            output, _ = job.communicate()
        pytest.fail(f"{ranks} ranks: still running after {TIMEOUT_SECONDS} s (a rank waiting "
                    f"for the others?)\n{' '.join(command)}\n{output}")
    assert job.returncode == 0, (
        f"{ranks} ranks: exit status {job.returncode}\n{' '.join(command)}\n{output}")


def _python(code):
    """code's output in a fresh interpreter that is no MPI job (singleton MPI at most)."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env={**os.environ, **MPI_ENVIRONMENT})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_import_attn_loads_neither_mpi4py_nor_libmpi():
    code = ("import sys, numpy as np, attn\n"
            "attn.attention(np.ones((3, 4), np.float32), np.ones((3, 4), np.float32), "
            "np.ones((3, 4), np.float32))\n"
            "maps = open('/proc/self/maps').read()\n"
            "print('mpi4py' in sys.modules, 'attn._dist' in sys.modules, 'libmpi' in maps)")
    assert _python(code) == "False False False"


def _import_error_without(module):
    """What `import attn.dist` raises when `module` cannot be imported."""
    return _python(f"import sys\nsys.modules[{module!r}] = None\n"
                   "try:\n    import attn.dist\nexcept ImportError as error:\n    print(error)\n"
                   "else:\n    print('imported')")


def test_import_attn_dist_without_mpi4py_says_how_to_install_it():
    message = _import_error_without("mpi4py")
    assert message.startswith("attn.dist needs mpi4py"), message
    assert "pip install --no-binary=mpi4py mpi4py" in message


def test_import_attn_dist_from_a_build_without_mpi_says_so():
    message = _import_error_without("attn._dist")
    assert message.startswith("attn.dist: this attn was built without MPI"), message
