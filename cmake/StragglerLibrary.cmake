# A library of the project: the target straggler_<name> (STATIC or SHARED)
# built from SOURCES, the alias straggler::<name> that other targets link,
# and, with INCLUDE <dir> (relative to the calling directory), <dir> as its
# public include directory in the build tree. An installed library adds
# straggler_shared_library below (which also names its include/ for the
# install).
#
#   straggler_library(engine STATIC INCLUDE include SOURCES src/policy.cc ...)
function(straggler_library name type)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "INCLUDE" "SOURCES")
  if(arg_UNPARSED_ARGUMENTS OR NOT arg_SOURCES)
    message(FATAL_ERROR "straggler_library(${name}): expected [INCLUDE dir] SOURCES files..., "
                        "got '${arg_UNPARSED_ARGUMENTS}'")
  endif()
  add_library(straggler_${name} ${type} ${arg_SOURCES})
  add_library(straggler::${name} ALIAS straggler_${name})
  if(arg_INCLUDE)
    target_include_directories(straggler_${name} PUBLIC
      $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/${arg_INCLUDE}>)
  endif()
endfunction()

# What every installed straggler library shares (docs/client.md): a
# versioned soname, exported as straggler::<export_name>, finding its sibling
# libraries beside itself ($ORIGIN) once installed, and public headers from
# the calling directory's include/ in the build tree and the install.
function(straggler_shared_library target export_name)
  set_target_properties(${target} PROPERTIES
    VERSION ${PROJECT_VERSION}
    SOVERSION ${PROJECT_VERSION_MAJOR}
    EXPORT_NAME ${export_name}
    INSTALL_RPATH "$ORIGIN")
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
endfunction()

# Installs `target` as the install component `component`, with the headers
# given after the export set (into include/straggler/), and its own export
# file `export_set`, which stragglerConfig.cmake loads only when the
# component is asked for: a machine without Gloo, NCCL or CUDA installs and
# finds the client alone.
function(straggler_install_component target component export_set)
  install(TARGETS ${target} EXPORT ${export_set}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ${component}
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ${component}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${component})
  install(FILES ${ARGN} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/straggler COMPONENT ${component})
  install(EXPORT ${export_set} NAMESPACE straggler::
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/straggler COMPONENT ${component})
endfunction()
