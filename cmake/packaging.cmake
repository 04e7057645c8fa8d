# Debian packages with CPack, one per install component (docs/packaging.md):
#   libdea-dev   the dev component: headers, CMake package, dea.pc, licence; architecture all; depends on libeigen3-dev
#   dea-tools    the tools component: the dea program and its bash completion; library dependencies from
#                dpkg-shlibdeps
#   python3-dea  the python component (the module `dea`), only where the target dea_python exists; depends on
#                python3 and python3-numpy, and on what dpkg-shlibdeps finds for the module; suggests python3-torch
# Each package carries share/doc/<package>/copyright (LICENSE in Debian's machine-readable copyright format) and
# share/doc/<package>/changelog.Debian.gz.
# Build the program first, then: cpack --config BUILD/CPackConfig.cmake -B BUILD/packages
# (packages are laid out under /usr; dpkg-shlibdeps comes with Debian's dpkg-dev).
set(DEA_PACKAGE_MAINTAINER "dea developers <dea@localhost>" CACHE STRING
    "The Maintainer field of the Debian packages")
set(dea_debian_release 1)  # the Debian revision: packages X.Y.Z-1

# share/doc/<package>/copyright (Debian policy 12.5) from LICENSE: its "Copyright (c) ..." line becomes the
# Copyright field, the text below it the licence paragraph (Debian's short name for the MIT licence is Expat).
function(dea_debian_copyright out)
  file(STRINGS ${PROJECT_SOURCE_DIR}/LICENSE lines)
  set(holder "")
  set(body "")
  set(in_body OFF)
  foreach(line IN LISTS lines)
    if(NOT in_body AND line MATCHES "^Copyright \\([cC]\\) (.+)$")
      set(holder "${CMAKE_MATCH_1}")
      set(in_body ON)
    elseif(in_body)
      if(line STREQUAL "")
        string(APPEND body " .\n")
      else()
        string(APPEND body " ${line}\n")
      endif()
    endif()
  endforeach()
  string(REGEX REPLACE "^( \\.\n)+" "" body "${body}")
  if(holder STREQUAL "" OR body STREQUAL "")
    message(FATAL_ERROR "LICENSE: no 'Copyright (c) ...' line followed by the licence text")
  endif()
  file(WRITE ${out}
       "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
       "Upstream-Name: ${PROJECT_NAME}\n\n"
       "Files: *\nCopyright: ${holder}\nLicense: Expat\n${body}")
endfunction()
dea_debian_copyright(${CMAKE_CURRENT_BINARY_DIR}/debian-copyright)

# share/doc/<package>/changelog.Debian.gz (Debian policy 12.7): one entry, this version built by CPack, dated when
# CMake configures (or at SOURCE_DATE_EPOCH when that is set), compressed with gzip -9n as Debian does.
set(DEA_DEBIAN_CHANGELOG "")
find_program(DEA_GZIP gzip)
mark_as_advanced(DEA_GZIP)
if(DEA_GZIP)
  string(TIMESTAMP dea_changelog_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/debian-changelog
       "${PROJECT_NAME} (${PROJECT_VERSION}-${dea_debian_release}) unstable; urgency=medium\n\n"
       "  * dea ${PROJECT_VERSION}, packaged by CPack from the project's CMake install components.\n\n"
       " -- ${DEA_PACKAGE_MAINTAINER}  ${dea_changelog_date}\n")
  execute_process(COMMAND ${DEA_GZIP} -9nf ${CMAKE_CURRENT_BINARY_DIR}/debian-changelog RESULT_VARIABLE gzip_status)
  if(gzip_status EQUAL 0)
    set(DEA_DEBIAN_CHANGELOG ${CMAKE_CURRENT_BINARY_DIR}/debian-changelog.gz)
  endif()
endif()
# the copyright file and the changelog of a package into share/doc/<package>
function(dea_debian_docs package component)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/debian-copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${package}
          RENAME copyright COMPONENT ${component})
  if(DEA_DEBIAN_CHANGELOG)
    install(FILES ${DEA_DEBIAN_CHANGELOG} DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${package}
            RENAME changelog.Debian.gz COMPONENT ${component})
  endif()
endfunction()
dea_debian_docs(libdea-dev dev)

# The tools component: the dea program (examples/) and its bash completion, written by the installed program's own
# `dea completion bash` at install time (so it always matches the program's flags; a cross build installs none).
if(TARGET dea_cli)
  dea_debian_docs(dea-tools tools)
  if(NOT CMAKE_CROSSCOMPILING)
    # (a file of its own for each install: ctest runs installs from this build tree side by side)
    install(CODE "
      string(RANDOM LENGTH 12 dea_completion_id)
      set(dea_completion \"${CMAKE_CURRENT_BINARY_DIR}/completion/dea-\${dea_completion_id}\")
      file(MAKE_DIRECTORY \"${CMAKE_CURRENT_BINARY_DIR}/completion\")
      execute_process(COMMAND \"$<TARGET_FILE:dea_cli>\" completion bash OUTPUT_FILE \"\${dea_completion}\"
                      RESULT_VARIABLE dea_completion_status)
      if(NOT dea_completion_status EQUAL 0)
        file(REMOVE \"\${dea_completion}\")
        message(FATAL_ERROR \"dea completion bash: exit status \${dea_completion_status}\")
      endif()
      file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DATADIR}/bash-completion/completions\"
           TYPE FILE RENAME dea FILES \"\${dea_completion}\")
      file(REMOVE \"\${dea_completion}\")" COMPONENT tools)
  endif()
endif()

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
set(CPACK_DEBIAN_PACKAGE_RELEASE ${dea_debian_release})
set(CPACK_STRIP_FILES ON)  # the program and the module without their symbol tables, as Debian ships binaries
# Each package's Description is its component's description: the first line the synopsis (at most 80 characters),
# the rest the long description (lines of at most 80). CPack would put the project's one-line summary above it (one synopsis for all packages, and the
# package's own first line pushed into the long text), so cpack forgets the summary when it runs.
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_CURRENT_BINARY_DIR}/CPackProjectConfig.cmake)
file(WRITE ${CPACK_PROJECT_CONFIG_FILE} "unset(CPACK_PACKAGE_DESCRIPTION_SUMMARY)\n")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libdea-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libeigen3-dev (>= 3.3)")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEV_DESCRIPTION "Dual-Expert Attention: header-only C++17 library on Eigen
Headers of dea (Dual-Expert Attention with hand-derived backward passes,
transformer layers, AdamW), with the CMake package (find_package(dea CONFIG),
target dea::dea) and the pkg-config file dea.pc.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME dea-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION science)
set(CPACK_COMPONENT_TOOLS_DESCRIPTION "Dual-Expert Attention: the dea program
Trains and evaluates Dual-Expert models, generates text, draws attention
pictures, runs reference cases, tokenizes and exports weights as C++ headers.
With its bash completion.")

# python3-dea: the Python module, where it is built (the target dea_python installs into the python component).
# The check runs when the top-level directory is done, so the module's directory may come after this file.
set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-dea)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3, python3-numpy")
set(CPACK_DEBIAN_PYTHON_PACKAGE_SUGGESTS python3-torch)  # for dea.torch only
set(CPACK_DEBIAN_PYTHON_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_COMPONENT_PYTHON_DESCRIPTION "Dual-Expert Attention: the Python module dea
The attention layers of dea (Dual-Expert, dot-product, Laplacian, token-routed)
over numpy arrays of float and double, forward and hand-derived backward, from
Python 3; dea.torch puts the Dual-Expert layer in PyTorch models.")
macro(dea_packaging_finish)
  if(DEA_NATIVE)
    message(STATUS "dea: DEA_NATIVE is on: the dea-tools and python3-dea packages cpack makes from this build run only "
                   "on CPUs with this machine's instruction sets; configure with -DDEA_NATIVE=OFF to make packages "
                   "for other machines")
  endif()
  if(TARGET dea_python)
    list(APPEND CPACK_COMPONENTS_ALL python)
    dea_debian_docs(python3-dea python)
  endif()
  include(CPack)
endmacro()
if(CMAKE_VERSION VERSION_LESS 3.19)
  dea_packaging_finish()
else()
  cmake_language(DEFER CALL dea_packaging_finish)
endif()
