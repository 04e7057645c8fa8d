# Data-parallel training on localhost (cmake/mpi.cmake, docs/scale.md), registered only when the build has MPI: the
# transport's own checks under mpiexec -np 4 (test_mpi_comm), and `mpirun -np R dea train` checked by
# tests/check_dist.py: the bitwise identity of one process and -np 1, 2, 4 for each model family (the gradient
# exchanged by buckets of 500 floats during backward, in one bucket, and by allgather), a resume across a change of
# the rank count, and the faults (a rank SIGKILLed while its steps exchange many buckets, a data file missing on one
# rank, a non-finite loss, a NaN loss on one rank's micro-batch); the evaluation shared by the ranks gives one
# process's numbers (`dea eval` under mpirun too).
# Tiny models and a few steps: a few seconds each. Each takes both cores (PROCESSORS 2), so that ctest -j2 runs it
# alone: four ranks already share the two.
if(DEA_MPI_ENABLED AND TARGET dea_cli AND Python3_Interpreter_FOUND AND MPIEXEC_EXECUTABLE)
  add_executable(test_mpi_comm test_mpi_comm.cpp)
  target_link_libraries(test_mpi_comm PRIVATE dea::dea dea_warnings dea_mpi fmt::fmt)
  add_test(NAME dist_mpi_comm COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe --bind-to none -np 4
           $<TARGET_FILE:test_mpi_comm>)
  set_tests_properties(dist_mpi_comm PROPERTIES PASS_REGULAR_EXPRESSION "4 ranks, mpi comm: all checks passed"
                       ENVIRONMENT "OMP_NUM_THREADS=1" PROCESSORS 2)
  set(dea_dist_checks "bitwise lm" "bitwise encoder" "bitwise encoder_text" "bitwise dea_bert" resume kill missing
      nonfinite "nonfinite_rank lm" "nonfinite_rank encoder")
  # the evaluation shared by the ranks: periodic (the log's evaluation lines) and `dea eval`, for each family; a run
  # directory missing on one rank of `dea eval`
  list(APPEND dea_dist_checks "eval lm" "eval encoder" "eval encoder_text" "eval dea_bert" eval_missing)
  # the LM corpus, read by offset, changed in the middle of a run
  list(APPEND dea_dist_checks changed)
  foreach(check ${dea_dist_checks})
    string(REPLACE " " ";" args "${check}")
    string(REPLACE " " "_" name "${check}")
    add_test(NAME dist_${name}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/check_dist.py --dea $<TARGET_FILE:dea_cli>
                     --mpirun ${MPIEXEC_EXECUTABLE} --work ${CMAKE_CURRENT_BINARY_DIR}/dist_${name}
                     --data ${CMAKE_CURRENT_SOURCE_DIR}/data ${args})
    set_tests_properties(dist_${name} PROPERTIES PASS_REGULAR_EXPRESSION "^dist .*: ok" PROCESSORS 2 TIMEOUT 300)
  endforeach()
endif()
