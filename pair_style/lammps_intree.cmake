# Builds pair_style e3fuse into a LAMMPS compiled from source with CMake, without
# editing LAMMPS's files:
#
#   cp <e3fuse>/pair_style/pair_e3fuse.{h,cpp} <e3fuse>/pair_style/e3fuse_mpi_exchange.{h,cpp} \
#      <lammps>/src/
#   cmake -S <lammps>/cmake -B build \
#         -D CMAKE_PROJECT_lammps_INCLUDE=<e3fuse>/pair_style/lammps_intree.cmake [other options]
#   cmake --build build -j
#
# CMake runs this file right after LAMMPS's project(lammps ...) call: it adds the
# e3fuse core as a subproject (no Python module, no plugin) and, deferred to the end
# of LAMMPS's CMakeLists.txt where the `lammps` target exists, links it into
# `lammps`, which also gives pair_e3fuse.cpp the e3fuse include directory (LAMMPS compiles
# every .cpp in src/, e3fuse_mpi_exchange.cpp with it).
# Needs CMake >= 3.24 (e3fuse's own minimum). E3FUSE_CUDA=ON/OFF and E3FUSE_NATIVE
# are passed through as usual (-D E3FUSE_CUDA=OFF ...).
#
# Equivalent by hand: append these two lines to <lammps>/cmake/CMakeLists.txt
#   add_subdirectory(<e3fuse> ${CMAKE_BINARY_DIR}/e3fuse EXCLUDE_FROM_ALL)
#   target_link_libraries(lammps PUBLIC e3fuse_core)
# and configure with -D E3FUSE_PYTHON=OFF -D E3FUSE_LAMMPS_PLUGIN=OFF.

if(CMAKE_VERSION VERSION_LESS 3.24)
  message(FATAL_ERROR "e3fuse in LAMMPS needs CMake >= 3.24 (this is ${CMAKE_VERSION})")
endif()

get_filename_component(_e3fuse_default_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(E3FUSE_SOURCE_DIR "${_e3fuse_default_root}" CACHE PATH "e3fuse source tree linked into LAMMPS")
set(E3FUSE_PYTHON OFF CACHE BOOL "Build the e3fuse Python module" FORCE)
set(E3FUSE_LAMMPS_PLUGIN OFF CACHE STRING "Build the e3fuse LAMMPS plugin" FORCE)

# The core is configured here (right after project(lammps)); linking it into the
# `lammps` target waits until LAMMPS's CMakeLists.txt has defined that target.
add_subdirectory("${E3FUSE_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/e3fuse" EXCLUDE_FROM_ALL)

function(_e3fuse_link_into_lammps)
  if(NOT TARGET lammps)
    message(FATAL_ERROR "e3fuse: LAMMPS's CMakeLists.txt defined no 'lammps' target")
  endif()
  if(DEFINED LAMMPS_SOURCE_DIR AND (NOT EXISTS "${LAMMPS_SOURCE_DIR}/pair_e3fuse.cpp" OR
                                     NOT EXISTS "${LAMMPS_SOURCE_DIR}/e3fuse_mpi_exchange.cpp"))
    message(FATAL_ERROR "e3fuse: copy pair_e3fuse.h, pair_e3fuse.cpp, e3fuse_mpi_exchange.h and "
                        "e3fuse_mpi_exchange.cpp from ${E3FUSE_SOURCE_DIR}/pair_style into "
                        "${LAMMPS_SOURCE_DIR} first")
  endif()
  target_link_libraries(lammps PUBLIC e3fuse_core)
  message(STATUS "e3fuse: pair_style e3fuse built into LAMMPS (core from ${E3FUSE_SOURCE_DIR})")
endfunction()

cmake_language(DEFER CALL _e3fuse_link_into_lammps)
