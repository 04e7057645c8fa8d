# The Python module `dea` (python/, docs/python.md): the compiled extension dea._core over numpy buffers, and the
# pure-Python package around it (dea/__init__.py, dea/torch.py). Optional, and nothing else depends on it: with
# DEA_PYTHON=AUTO it is built when Python 3's development files and pybind11 (Debian: python3-dev, pybind11-dev)
# are found, and skipped with one status line otherwise; ON makes their absence an error; OFF skips it.
#
# Target dea_python (install component "python"). In the build tree the package is laid out in
# BUILD/python/dea/, so `PYTHONPATH=BUILD/python /usr/bin/python3 -c "import dea"` works without installing.
#
# The interpreter: Debian's /usr/bin/python3 when it exists (the one that finds Debian's python3-numpy and
# python3-torch), whatever `python3` is first on PATH; -DPython3_EXECUTABLE=... chooses another.
set(DEA_PYTHON_ENABLED OFF)
if(NOT DEA_PYTHON STREQUAL "OFF")
  set(dea_python_why "")
  if(DEA_SANITIZE)
    # an extension built with the sanitizers only loads into an interpreter started with their runtime preloaded
    set(dea_python_why "not built under DEA_SANITIZE")
  elseif(DEA_BUILD_FUZZ)
    set(dea_python_why "not built with the fuzz targets")
  else()
    if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
      set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "The Python 3 interpreter the module is built for")
    endif()
    find_package(Python3 3.7 QUIET COMPONENTS Interpreter Development.Module)
    if(NOT Python3_FOUND)
      set(dea_python_why "Python 3 development files not found (Debian: python3-dev)")
    else()
      find_package(pybind11 2.6 CONFIG QUIET)
      if(NOT pybind11_FOUND)
        set(dea_python_why "pybind11 not found (Debian: pybind11-dev)")
      endif()
    endif()
  endif()
  if(dea_python_why STREQUAL "")
    set(DEA_PYTHON_ENABLED ON)
  elseif(DEA_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "DEA_PYTHON=ON but the Python module cannot be built: ${dea_python_why}")
  else()
    message(STATUS "dea: Python module off (${dea_python_why}; DEA_PYTHON=${DEA_PYTHON})")
  endif()
endif()

if(DEA_PYTHON_ENABLED)
  message(STATUS "dea: Python module on, for ${Python3_EXECUTABLE} (Python ${Python3_VERSION}, pybind11 "
                 "${pybind11_VERSION})")
  set(DEA_PYTHON_DIR ${PROJECT_BINARY_DIR}/python CACHE INTERNAL "Build-tree directory to put on PYTHONPATH")
  # The template instances the module runs, compiled as position-independent code for the shared module (the
  # project's dea_instances library is not); with DEA_EXTERN_INSTANCES=OFF the module instantiates them itself.
  set(dea_python_sources ${PROJECT_SOURCE_DIR}/python/dea_module.cpp)
  if(DEA_EXTERN_INSTANCES)
    foreach(inst dual_expert_float dual_expert_double token_routed_float token_routed_double transformer_float
                 transformer_double init)
      list(APPEND dea_python_sources ${PROJECT_SOURCE_DIR}/cmake/instances/${inst}.cpp)
    endforeach()
  endif()
  # NO_EXTRAS: no link-time optimisation (the kernels are in their own translation units either way, and a link of
  # the instances with LTO takes minutes)
  pybind11_add_module(dea_python MODULE NO_EXTRAS ${dea_python_sources})
  target_link_libraries(dea_python PRIVATE dea::dea nlohmann_json::nlohmann_json fmt::fmt dea_warnings)
  if(DEA_EXTERN_INSTANCES)
    target_compile_definitions(dea_python PRIVATE DEA_EXTERN_TEMPLATES)
  endif()
  set_target_properties(dea_python PROPERTIES OUTPUT_NAME _core LIBRARY_OUTPUT_DIRECTORY ${DEA_PYTHON_DIR}/dea)
  # the package's Python files beside the extension (copied again whenever one changes)
  set(dea_python_files __init__.py torch.py)
  foreach(f ${dea_python_files})
    configure_file(${PROJECT_SOURCE_DIR}/python/dea/${f} ${DEA_PYTHON_DIR}/dea/${f} COPYONLY)
  endforeach()

  # Installed where Debian's /usr/bin/python3 looks for packages of the system prefix /usr
  # (/usr/lib/python3/dist-packages); under another prefix, put PREFIX/DEA_PYTHON_INSTALL_DIR on PYTHONPATH.
  set(DEA_PYTHON_INSTALL_DIR lib/python3/dist-packages CACHE STRING
      "Where the Python package dea is installed, relative to the prefix")
  install(TARGETS dea_python LIBRARY DESTINATION ${DEA_PYTHON_INSTALL_DIR}/dea COMPONENT python)
  list(TRANSFORM dea_python_files PREPEND ${PROJECT_SOURCE_DIR}/python/dea/)
  install(FILES ${dea_python_files} DESTINATION ${DEA_PYTHON_INSTALL_DIR}/dea COMPONENT python)
endif()
