import pytest

# tests/python/mpi/ runs on every rank of an MPI job, which tests/python/test_dist.py starts
# with mpirun; a plain pytest run of tests/python does not collect it itself.
collect_ignore = ["mpi"]


@pytest.fixture(scope="session")
def emulator():
    """The emulated Sapphire Rapids of tests/python/emulator.py, made once: BochsCPU holds one
    CPU per process."""
    from emulator import Emulator
    return Emulator()
