# tests/python/mpi/ runs on every rank of an MPI job, which tests/python/test_dist.py starts
# with mpirun; a plain pytest run of tests/python does not collect it itself.
collect_ignore = ["mpi"]
