# Debian packages of an already built tree (docs/operations.md, "Install
# from the package"): `cpack -G DEB --config build/CPackConfig.cmake`, or
# scripts/package.sh. CPack runs the install rules of the build tree into a
# staging root under /usr; nothing is rebuilt.
#
#   stragglerd   daemon, agent, CLI and tools (install component Unspecified),
#                the systemd units and the sysusers entry (deploy), the example
#                configs as conffiles under /etc (etc_config)
#   libstraggler0 libstraggler and libstraggler_proto, the headers and the CMake
#                package config (client): what a trainer's machine needs.
#
# One client package rather than a -dev split: the headers and the CMake config
# are a few files, and a trainer that links the library builds against it on
# the same machine; the daemon package needs the libraries too, because the
# executables link libstraggler_proto. The python, collective and GPU
# components (cuda, collective_nccl) are left out of the packages: the Python
# package is pip's (docs/python.md), the others need Gloo/CUDA/NCCL.
#
# Depends of both come from dpkg-shlibdeps on the packaged ELF files
# (CPACK_DEBIAN_PACKAGE_SHLIBDEPS), not a hand-kept list; the only hand entry is
# stragglerd's dependency on the libstraggler0 of the same version.

# Example configs under /etc for the package only: an absolute destination
# that `cmake --install BUILD --prefix DIR` leaves alone (EXCLUDE_FROM_ALL), so
# an install into a prefix never writes /etc.
install(FILES deploy/stragglerd.yaml DESTINATION /etc/stragglerd
  COMPONENT etc_config EXCLUDE_FROM_ALL)
install(FILES deploy/straggler-agent.yaml DESTINATION /etc/straggler
  COMPONENT etc_config EXCLUDE_FROM_ALL)
file(WRITE ${PROJECT_BINARY_DIR}/packaging/conffiles
  "/etc/stragglerd/stragglerd.yaml\n/etc/straggler/straggler-agent.yaml\n")

# What Debian policy wants in every package (lintian errors without them):
# /usr/share/doc/<package>/copyright and changelog.gz (a native package's, so
# its date follows SOURCE_DATE_EPOCH when set), and the client's ldconfig
# trigger. Packaging-only components, like etc_config.
string(TIMESTAMP _deb_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
set(_deb_maintainer "stragglerd maintainers <stragglerd@example.com>")
foreach(_pkg stragglerd libstraggler0)
  set(_dir ${PROJECT_BINARY_DIR}/packaging/doc/${_pkg})
  file(WRITE ${_dir}/changelog "${_pkg} (${PROJECT_VERSION}) unstable; urgency=medium\n\n"
    "  * Built from the stragglerd source tree with CPack (scripts/package.sh).\n\n"
    " -- ${_deb_maintainer}  ${_deb_date}\n")
  execute_process(COMMAND gzip -9nf ${_dir}/changelog)
  configure_file(${PROJECT_SOURCE_DIR}/deploy/debian/copyright ${_dir}/copyright COPYONLY)
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/packaging/doc/stragglerd/changelog.gz
  ${PROJECT_BINARY_DIR}/packaging/doc/stragglerd/copyright
  DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/stragglerd COMPONENT deb_daemon_doc EXCLUDE_FROM_ALL)
install(FILES ${PROJECT_BINARY_DIR}/packaging/doc/libstraggler0/changelog.gz
  ${PROJECT_BINARY_DIR}/packaging/doc/libstraggler0/copyright
  DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/libstraggler0 COMPONENT deb_client_doc
  EXCLUDE_FROM_ALL)
file(WRITE ${PROJECT_BINARY_DIR}/packaging/triggers "activate-noawait ldconfig\n")
# With the trigger, ldconfig runs once per dpkg run; CPack's default postinst
# and postrm would run it again in each (lintian: maintscript-calls-ldconfig).
# Scripts of our own replace them: nothing to do.
foreach(_script postinst postrm)
  file(WRITE ${PROJECT_BINARY_DIR}/packaging/${_script}
    "#!/bin/sh\n# libstraggler0: ldconfig runs through the package's trigger.\nset -e\n")
  file(CHMOD ${PROJECT_BINARY_DIR}/packaging/${_script} FILE_PERMISSIONS
    OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endforeach()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME stragglerd)
set(CPACK_PACKAGE_VENDOR "stragglerd")
set(CPACK_PACKAGE_CONTACT "${_deb_maintainer}")
# No CPACK_PACKAGE_DESCRIPTION_SUMMARY: CPack would put it before each
# package's description, whose first line is already its synopsis.
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_HOMEPAGE_URL "https://github.com/stragglerd/stragglerd")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_STRIP_FILES ON)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL Unspecified deploy etc_config deb_daemon_doc client deb_client_doc)
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)
foreach(_c Unspecified deploy etc_config deb_daemon_doc)
  string(TOUPPER ${_c} _C)
  set(CPACK_COMPONENT_${_C}_GROUP daemon)
endforeach()
set(CPACK_COMPONENT_CLIENT_GROUP client)
set(CPACK_COMPONENT_DEB_CLIENT_DOC_GROUP client)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# libstraggler_proto.so.0 is ours, in the client package: let dpkg-shlibdeps
# find it there instead of failing on a library no installed package has.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS
  ${PROJECT_BINARY_DIR}/proto ${PROJECT_BINARY_DIR}/client_lib)

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME stragglerd)
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "libstraggler0 (= ${PROJECT_VERSION})")
set(CPACK_DEBIAN_DAEMON_DESCRIPTION
  "straggler monitoring daemon for distributed training
stragglerd receives per-step timings from every rank of a training job,
finds the slow ranks and publishes a membership that leaves them out.
This package holds the daemon, the per-node agent, the stragglerctl CLI,
their systemd units and example configuration.")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/packaging/conffiles)

set(CPACK_DEBIAN_CLIENT_PACKAGE_NAME libstraggler0)
set(CPACK_DEBIAN_CLIENT_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_CLIENT_DESCRIPTION
  "client library of stragglerd, straggler monitoring for training
libstraggler reports a training rank's step times to stragglerd and reads
back the job's membership. This package holds the shared libraries, the C
and C++ headers and the CMake package config (find_package(straggler)).")
# shlibs with `=`: the 0.x ABI may change in any release.
# (CPack has no per-package switch; stragglerd holds no shared object.)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY "=")
set(CPACK_DEBIAN_CLIENT_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/packaging/triggers
  ${PROJECT_BINARY_DIR}/packaging/postinst ${PROJECT_BINARY_DIR}/packaging/postrm)

include(CPack)
