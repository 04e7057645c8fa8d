# The Python module's tests (cmake/python.cmake builds the module): one ctest per file, run by the interpreter the
# module was built for, on the build tree's package. A test that needs a module which is not installed (torch)
# exits with 77 and is reported as skipped, not passed.
if(DEA_PYTHON_ENABLED)
  set(dea_python_test_env
      "PYTHONPATH=${DEA_PYTHON_DIR}"
      "PYTHONDONTWRITEBYTECODE=1"
      "DEA_TEST_DATA=${PROJECT_SOURCE_DIR}/tests/data"
      "DEA_BENCH_DIR=${PROJECT_SOURCE_DIR}/bench"
      "OMP_WAIT_POLICY=PASSIVE")
  foreach(t module torch)
    add_test(NAME python_${t} COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_${t}.py)
  endforeach()
  # the example: the reference's golden model case through its TransformerModel, then a few training steps
  add_test(NAME python_example COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/run_example.py --steps 3 --check)
  set_tests_properties(python_module python_torch python_example PROPERTIES
                       ENVIRONMENT "${dea_python_test_env}" SKIP_RETURN_CODE 77 LABELS python)
endif()
