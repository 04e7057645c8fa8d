# Debian packages with CPack, one per install component (docs/packaging.md):
#   libdea-dev  the dev component: headers, CMake package, dea.pc, licence; architecture all; depends on libeigen3-dev
#   dea-tools   the tools component: the dea program; its library dependencies found by dpkg-shlibdeps
# Build the program first, then: cpack --config BUILD/CPackConfig.cmake -B BUILD/packages
# (packages are laid out under /usr; dpkg-shlibdeps comes with Debian's dpkg-dev).
set(DEA_PACKAGE_MAINTAINER "dea developers <dea@localhost>" CACHE STRING
    "The Maintainer field of the Debian packages")
set(CPACK_PACKAGE_NAME dea)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_CONTACT "${DEA_PACKAGE_MAINTAINER}")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL dev tools)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libdea-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libeigen3-dev (>= 3.3)")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEV_DESCRIPTION "Dual-Expert Attention: header-only C++17 library on Eigen
 Headers of dea (Dual-Expert Attention with hand-derived backward passes, transformer layers, AdamW), with the
 CMake package (find_package(dea CONFIG), target dea::dea) and the pkg-config file dea.pc.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME dea-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION science)
set(CPACK_COMPONENT_TOOLS_DESCRIPTION "Dual-Expert Attention: the dea program
 Trains and evaluates Dual-Expert models, generates text, draws attention pictures, runs reference cases,
 tokenizes and exports weights as C++ headers.")
include(CPack)
