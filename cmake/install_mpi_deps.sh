#!/usr/bin/env bash
# Installs what the data-parallel trainer needs beyond the build's packages: Open MPI (its mpirun and its
# development files), from Debian's packages only. With them CMake finds MPI (cmake/mpi.cmake: DEA_WITH_MPI ON),
# `mpirun -np R dea train` trains data parallel and ctest runs the dist_* tests (docs/scale.md).
# Usage: bash cmake/install_mpi_deps.sh   (as root on Debian 12; does nothing for packages already present)
set -euo pipefail
bash "$(dirname "$0")/install_deps.sh" openmpi-bin libopenmpi-dev
