# Template instances compiled once for the project's own programs and tests (never for users of dea::dea).
#
# A translation unit that runs DualExpertAttention, TransformerModel or the BERT models instantiates their kernels,
# and that costs over a minute of compile time per scalar type, almost all of it in the compiler's front end
# (optimisation level barely matters). The project's programs and tests link dea_instances, which compiles the float and double
# instances once, in parallel; DEA_EXTERN_TEMPLATES makes the headers declare them `extern template`, and
# because the heavy member functions are defined outside their class (not inline), other translation units
# then instantiate none of them. Users who include the headers without the macro instantiate as usual.
option(DEA_EXTERN_INSTANCES "Compile the common template instances once for the project's programs and tests" ON)
if(DEA_EXTERN_INSTANCES)
  set(DEA_INSTANCE_SOURCES)
  foreach(inst dual_expert_float dual_expert_double transformer_float transformer_double token_routed_float
               token_routed_double bert_float bert_double init)
    list(APPEND DEA_INSTANCE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/instances/${inst}.cpp)
  endforeach()
  add_library(dea_instances STATIC EXCLUDE_FROM_ALL ${DEA_INSTANCE_SOURCES})
  target_link_libraries(dea_instances PUBLIC dea::dea PRIVATE dea_warnings)
  target_compile_definitions(dea_instances PUBLIC DEA_EXTERN_TEMPLATES)
  # DEA_INSTANCES_OPT (e.g. -O1): the optimisation level of these instances alone. The asan preset builds the tests
  # at -O0 (clang compiles them 2.5x faster there) and the kernels at -O1, where the suite spends its run time.
  set(DEA_INSTANCES_OPT "" CACHE STRING "Optimisation flag for dea_instances only (empty: the build type's)")
  if(DEA_INSTANCES_OPT)
    target_compile_options(dea_instances PRIVATE ${DEA_INSTANCES_OPT})
  endif()
  # The compile-time shapes only the tests use (tests/instances/, declared by tests/instances/dual_expert_shapes.hpp):
  # a library of their own, so that nothing test-only is part of the library's interface or its instance list.
  set(DEA_TEST_INSTANCE_SOURCES)
  foreach(inst dual_expert_double_2x1 dual_expert_double_2x4 dual_expert_float_2x8)
    list(APPEND DEA_TEST_INSTANCE_SOURCES ${PROJECT_SOURCE_DIR}/tests/instances/${inst}.cpp)
  endforeach()
  add_library(dea_test_instances STATIC EXCLUDE_FROM_ALL ${DEA_TEST_INSTANCE_SOURCES})
  target_link_libraries(dea_test_instances PUBLIC dea_instances PRIVATE dea_warnings)
  if(DEA_INSTANCES_OPT)
    target_compile_options(dea_test_instances PRIVATE ${DEA_INSTANCES_OPT})
  endif()
else()
  add_library(dea_instances INTERFACE)
  add_library(dea_test_instances INTERFACE)
endif()
