# Install rules and package metadata. Included at the very end of the top
# CMakeLists.txt, when every target of the project exists.
#
# `cmake --install <build> [--prefix P]` installs:
#   include/nccl.h, include/loom/*.h, include/loom/version.h (generated)
#   lib/libnccl.so.2 (+ libnccl.so namelink), lib/libloom.so
#   bin/<every executable defined under tools/ or listed in LOOM_TOOL_TARGETS>
#   lib/cmake/loom/loomConfig*.cmake   find_package(loom) -> loom::nccl, loom::loom
#   lib/pkgconfig/nccl.pc, loom.pc
# The result is relocatable: libraries find each other through $ORIGIN, tools
# find the libraries through $ORIGIN/../lib, and the package config locates
# itself. The .pc files are written at install time, so they name the prefix
# actually used (including --prefix overrides).
#
# Tools outside tools/ (or in a directory added later) are installed when
# their target name is appended to the global property LOOM_TOOL_TARGETS:
#   set_property(GLOBAL APPEND PROPERTY LOOM_TOOL_TARGETS my_tool)
# An executable under tools/ that must not be installed sets the target
# property LOOM_NO_INSTALL to ON.
#
# tests/unit/api checks the install; the list of files it expects is written
# to <build>/loom-package/install-expected.txt below.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(LOOM_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/loom")
set(LOOM_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
set(_loom_pkg_dir "${CMAKE_BINARY_DIR}/loom-package")
# Relative paths (from the install prefix) the install test expects to find.
set(_loom_expected "")

# ---- headers -----------------------------------------------------------------
install(FILES "${PROJECT_SOURCE_DIR}/include/nccl.h"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT devel)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/loom/"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/loom" COMPONENT devel
        FILES_MATCHING PATTERN "*.h")
install(FILES "${CMAKE_BINARY_DIR}/include/loom/version.h"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/loom" COMPONENT devel)

string(APPEND _loom_expected
  "${CMAKE_INSTALL_INCLUDEDIR}/nccl.h\n"
  "${CMAKE_INSTALL_INCLUDEDIR}/loom/version.h\n")
file(GLOB_RECURSE _loom_public_headers RELATIVE "${PROJECT_SOURCE_DIR}/include/loom"
     "${PROJECT_SOURCE_DIR}/include/loom/*.h")
foreach(_h IN LISTS _loom_public_headers)
  string(APPEND _loom_expected "${CMAKE_INSTALL_INCLUDEDIR}/loom/${_h}\n")
endforeach()

# ---- libraries -------------------------------------------------------------
# Both are created in src/api/CMakeLists.txt. Until they exist, configure
# still works and simply installs less.
set(_loom_imported_targets "")
foreach(_lib IN ITEMS nccl loom)
  if(NOT TARGET ${_lib})
    message(STATUS "loom install: target '${_lib}' is not defined; it will not be installed")
    continue()
  endif()
  get_target_property(_type ${_lib} TYPE)
  if(NOT _type STREQUAL "SHARED_LIBRARY")
    message(WARNING "loom install: target '${_lib}' is a ${_type}, expected a shared library; "
                    "it is not installed or exported. Make it add_library(${_lib} SHARED ...).")
    continue()
  endif()
  get_target_property(_rpath ${_lib} INSTALL_RPATH)
  if(NOT _rpath)
    # libloom.so and libnccl.so.2 sit in the same folder.
    set_target_properties(${_lib} PROPERTIES INSTALL_RPATH "$ORIGIN")
  endif()
  install(TARGETS ${_lib}
          LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT runtime
                  NAMELINK_COMPONENT devel)
  string(APPEND _loom_expected
    "${CMAKE_INSTALL_LIBDIR}/$<TARGET_FILE_NAME:${_lib}>\n"
    "${CMAKE_INSTALL_LIBDIR}/$<TARGET_SONAME_FILE_NAME:${_lib}>\n"
    "${CMAKE_INSTALL_LIBDIR}/$<TARGET_LINKER_FILE_NAME:${_lib}>\n")
  # Block for loomConfig.cmake. ${...} stays literal here and is evaluated by
  # the consumer; $<...> is resolved when the config file is generated.
  string(APPEND _loom_imported_targets
    "if(NOT TARGET loom::${_lib})\n"
    "  add_library(loom::${_lib} SHARED IMPORTED)\n"
    "  set_target_properties(loom::${_lib} PROPERTIES\n"
    "    IMPORTED_LOCATION \"\${_loom_libdir}/$<TARGET_FILE_NAME:${_lib}>\"\n"
    "    IMPORTED_SONAME \"$<TARGET_SONAME_FILE_NAME:${_lib}>\"\n"
    "    INTERFACE_INCLUDE_DIRECTORIES \"\${loom_INCLUDE_DIR}\")\n"
    "endif()\n"
    "set(loom_${_lib}_FOUND TRUE)\n")
endforeach()

# ---- tools -------------------------------------------------------------------
# Every executable defined in tools/ or its subfolders, plus LOOM_TOOL_TARGETS.
function(_loom_collect_executables dir out_var)
  set(found "")
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "EXECUTABLE")
      list(APPEND found ${t})
    endif()
  endforeach()
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _loom_collect_executables("${sub}" sub_found)
    list(APPEND found ${sub_found})
  endforeach()
  set(${out_var} ${found} PARENT_SCOPE)
endfunction()

set(_loom_tools "")
get_property(_loom_top_subdirs DIRECTORY "${PROJECT_SOURCE_DIR}" PROPERTY SUBDIRECTORIES)
if("${PROJECT_SOURCE_DIR}/tools" IN_LIST _loom_top_subdirs)
  _loom_collect_executables("${PROJECT_SOURCE_DIR}/tools" _loom_tools)
endif()
get_property(_loom_listed_tools GLOBAL PROPERTY LOOM_TOOL_TARGETS)
list(APPEND _loom_tools ${_loom_listed_tools})
list(REMOVE_DUPLICATES _loom_tools)

file(RELATIVE_PATH _loom_bin_to_lib "${CMAKE_INSTALL_FULL_BINDIR}" "${CMAKE_INSTALL_FULL_LIBDIR}")
set(_loom_installed_tools "")
foreach(_tool IN LISTS _loom_tools)
  if(NOT TARGET ${_tool})
    message(WARNING "loom install: LOOM_TOOL_TARGETS names '${_tool}', which is not a target")
    continue()
  endif()
  get_target_property(_type ${_tool} TYPE)
  get_target_property(_skip ${_tool} LOOM_NO_INSTALL)
  get_target_property(_not_built ${_tool} EXCLUDE_FROM_ALL)
  if(NOT _type STREQUAL "EXECUTABLE" OR _skip OR _not_built)
    continue()
  endif()
  get_target_property(_rpath ${_tool} INSTALL_RPATH)
  if(NOT _rpath)
    set_target_properties(${_tool} PROPERTIES INSTALL_RPATH "$ORIGIN/${_loom_bin_to_lib}")
  endif()
  list(APPEND _loom_installed_tools ${_tool})
  string(APPEND _loom_expected "${CMAKE_INSTALL_BINDIR}/$<TARGET_FILE_NAME:${_tool}>\n")
endforeach()
if(_loom_installed_tools)
  install(TARGETS ${_loom_installed_tools}
          RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT tools)
endif()
list(JOIN _loom_installed_tools " " _loom_tools_text)
message(STATUS "loom install: tools: ${_loom_tools_text}")

# ---- CMake package -----------------------------------------------------------
# Imported targets are written by hand (not install(EXPORT)) so the package
# does not depend on how the libraries link internally: consumers only need
# the shared objects and the include folder.
set(LOOM_NCCL_VERSION_STRING "${LOOM_NCCL_MAJOR}.${LOOM_NCCL_MINOR}.${LOOM_NCCL_PATCH}")
set(LOOM_PACKAGE_TARGETS "${_loom_imported_targets}")
configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/loomConfig.cmake.in"
  "${_loom_pkg_dir}/loomConfig.cmake.stage"
  INSTALL_DESTINATION "${LOOM_INSTALL_CMAKEDIR}"
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR)
# Second pass resolves the $<TARGET_...> file names of the imported targets.
file(GENERATE OUTPUT "${_loom_pkg_dir}/loomConfig.cmake"
     INPUT "${_loom_pkg_dir}/loomConfig.cmake.stage")
# loom is pre-1.0: a minor release may change the C++ API.
write_basic_package_version_file("${_loom_pkg_dir}/loomConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMinorVersion)
install(FILES "${_loom_pkg_dir}/loomConfig.cmake" "${_loom_pkg_dir}/loomConfigVersion.cmake"
        DESTINATION "${LOOM_INSTALL_CMAKEDIR}" COMPONENT devel)
string(APPEND _loom_expected
  "${LOOM_INSTALL_CMAKEDIR}/loomConfig.cmake\n"
  "${LOOM_INSTALL_CMAKEDIR}/loomConfigVersion.cmake\n")

# ---- pkg-config --------------------------------------------------------------
# Written during the install step, where CMAKE_INSTALL_PREFIX is the prefix
# really used, then installed like any file (so it is in install_manifest).
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(_loom_pc_libdir "${CMAKE_INSTALL_LIBDIR}")
else()
  set(_loom_pc_libdir "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(_loom_pc_includedir "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(_loom_pc_includedir "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
install(CODE "
  set(LOOM_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(LOOM_PC_LIBDIR \"${_loom_pc_libdir}\")
  set(LOOM_PC_INCLUDEDIR \"${_loom_pc_includedir}\")
  set(LOOM_PC_NCCL_VERSION \"${LOOM_NCCL_VERSION_STRING}\")
  set(LOOM_PC_VERSION \"${PROJECT_VERSION}\")
  configure_file(\"${PROJECT_SOURCE_DIR}/cmake/nccl.pc.in\" \"${_loom_pkg_dir}/nccl.pc\" @ONLY)
  configure_file(\"${PROJECT_SOURCE_DIR}/cmake/loom.pc.in\" \"${_loom_pkg_dir}/loom.pc\" @ONLY)
" COMPONENT devel)
install(FILES "${_loom_pkg_dir}/nccl.pc" "${_loom_pkg_dir}/loom.pc"
        DESTINATION "${LOOM_INSTALL_PKGCONFIGDIR}" COMPONENT devel)
string(APPEND _loom_expected
  "${LOOM_INSTALL_PKGCONFIGDIR}/nccl.pc\n"
  "${LOOM_INSTALL_PKGCONFIGDIR}/loom.pc\n")

file(GENERATE OUTPUT "${_loom_pkg_dir}/install-expected.txt" CONTENT "${_loom_expected}")
