# bench_dist (bench/bench_dist.cpp): the data-parallel training step and both gradient exchanges, one process or under
# mpirun; built when the build has MPI (cmake/mpi.cmake). docs/scale.md has the commands and the figures.
if(DEA_MPI_ENABLED)
  add_executable(bench_dist ${CMAKE_CURRENT_LIST_DIR}/bench_dist.cpp)
  target_link_libraries(bench_dist PRIVATE dea::dea dea_instances dea_warnings dea_mpi fmt::fmt
                        nlohmann_json::nlohmann_json)
  set_target_properties(bench_dist PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)  # beside the others
  # its smoke test (tests/check_dist.py bench): the quick configuration and two buffer sizes under -np 2
  if(DEA_BUILD_TESTS)
    find_package(Python3 COMPONENTS Interpreter)  # tests/ found it in its own scope
  endif()
  if(DEA_BUILD_TESTS AND Python3_Interpreter_FOUND AND MPIEXEC_EXECUTABLE AND TARGET dea_cli)
    add_test(NAME dist_bench
             COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/check_dist.py --dea $<TARGET_FILE:dea_cli>
                     --mpirun ${MPIEXEC_EXECUTABLE} --work ${PROJECT_BINARY_DIR}/tests/dist_bench
                     --data ${PROJECT_SOURCE_DIR}/tests/data --bench_dist $<TARGET_FILE:bench_dist> bench)
    set_tests_properties(dist_bench PROPERTIES PASS_REGULAR_EXPRESSION "^dist .*: ok" PROCESSORS 2 TIMEOUT 300)
  endif()
endif()

# the predictions of docs/scale.md are bench/dist_model.py's output: every table row it prints must be in the page
if(DEA_BUILD_TESTS)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    add_test(NAME dist_model COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/dist_model.py
                                     --check ${PROJECT_SOURCE_DIR}/docs/scale.md)
    set_tests_properties(dist_model PROPERTIES PASS_REGULAR_EXPRESSION "^dist model: .*: ok" TIMEOUT 60)
  endif()
endif()
