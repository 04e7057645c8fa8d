# MPI, optional: the data-parallel trainer (`mpirun -np R dea train`, docs/scale.md) and its tests. The library
# itself never needs it (include/dea/dist/ is MPI-free but for dist/mpi_comm.hpp, which only programs built with MPI
# include). DEA_WITH_MPI is ON when MPI is found (Debian: cmake/install_mpi_deps.sh) and off when it is absent; a
# value given with -DDEA_WITH_MPI=... is kept, the default follows MPI when it is installed or removed later.
# dea_mpi: the interface target such programs link (MPI's C API; the C++ bindings are left out; DEA_WITH_MPI
# defined).
set(MPI_CXX_SKIP_MPICXX ON)
find_package(MPI COMPONENTS CXX QUIET)
set(dea_mpi_found OFF)
if(MPI_CXX_FOUND)
  set(dea_mpi_found ON)
endif()
if(DEFINED DEA_WITH_MPI_DEFAULT AND DEFINED DEA_WITH_MPI AND "${DEA_WITH_MPI}" STREQUAL "${DEA_WITH_MPI_DEFAULT}")
  set(DEA_WITH_MPI ${dea_mpi_found} CACHE BOOL "" FORCE)  # never set by hand: follows MPI
endif()
option(DEA_WITH_MPI "Build the data-parallel trainer and its tests on MPI (default: ON when MPI is found)" ${dea_mpi_found})
set(DEA_WITH_MPI_DEFAULT ${dea_mpi_found} CACHE INTERNAL "the default DEA_WITH_MPI was given")
set(DEA_MPI_ENABLED OFF)
if(DEA_WITH_MPI)
  if(MPI_CXX_FOUND)
    set(DEA_MPI_ENABLED ON)
    add_library(dea_mpi INTERFACE)
    target_link_libraries(dea_mpi INTERFACE MPI::MPI_CXX)
    target_compile_definitions(dea_mpi INTERFACE DEA_WITH_MPI=1 OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
    message(STATUS "MPI ${MPI_CXX_VERSION} found: the data-parallel trainer is built (mpirun: ${MPIEXEC_EXECUTABLE})")
  else()
    message(STATUS "MPI not found: DEA_WITH_MPI off (the data-parallel trainer and its tests are not built)")
  endif()
endif()
