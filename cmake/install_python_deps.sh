#!/usr/bin/env bash
# Installs what the Python module dea and its tests need beyond the build's packages, from Debian's packages only:
# pybind11 and Python's development files (CMake then builds the module: cmake/python.cmake), numpy, and PyTorch for
# dea.torch's tests, the example and the benchmark (without python3-torch those tests are reported as skipped).
# libopenblas0-pthread: torch's BLAS (without it torch falls back to a slow reference BLAS). The tests are plain
# scripts with their own small runner (tests/python/harness.py): no pytest.
# Usage: bash cmake/install_python_deps.sh   (as root on Debian 12; does nothing for packages already present)
set -euo pipefail
bash "$(dirname "$0")/install_deps.sh" pybind11-dev python3-dev python3-numpy python3-torch libopenblas0-pthread
