# bench_dist (bench/bench_dist.cpp): the data-parallel training step and the allgather + tree, one process or under
# mpirun; built when the build has MPI (cmake/mpi.cmake). docs/scale.md has the commands and the figures.
if(DEA_MPI_ENABLED)
  # not part of `all` (CI builds everything; the benchmark is built when asked for: --target bench_dist)
  add_executable(bench_dist EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/bench_dist.cpp)
  target_link_libraries(bench_dist PRIVATE dea::dea dea_instances dea_warnings dea_mpi fmt::fmt
                        nlohmann_json::nlohmann_json)
  set_target_properties(bench_dist PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)  # beside the others
endif()
