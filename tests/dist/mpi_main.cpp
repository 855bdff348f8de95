// gtest under mpirun: every rank runs every test, ranks past 0 print only their failures,
// rank 0 names the tests it skipped, and the process exits non-zero on every rank when any
// rank had a failure.
#include <gtest/gtest.h>
#include <mpi.h>

#include "support/skipped_tests.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    attn::testing::print_skipped_tests();
  } else {
    GTEST_FLAG_SET(brief, true);
  }
  const int mine = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
