# Debian packages of an already built tree (docs/operations.md, "Install
# from the package"): `cpack -G DEB --config build/CPackConfig.cmake`, or
# scripts/package.sh. CPack runs the install rules of the build tree into a
# staging root under /usr; nothing is rebuilt. One package per group below;
# a group whose parts this build lacks is not packaged at all.
#
#   stragglerd      daemon, agent, CLI and tools (install component Unspecified),
#                   the systemd units and the sysusers entry (deploy), the example
#                   configs as conffiles under /etc (etc_config)
#   libstraggler0   libstraggler and libstraggler_proto, their headers and the
#                   CMake package config (client): what a trainer's machine needs
#   libstraggler-collective0       PartialAllReduce over Gloo (collective); builds with Gloo
#   libstraggler-cuda0             GPU compute timer (cuda); builds with CUDA
#   libstraggler-collective-nccl0  NCCL backend (collective_nccl); builds with CUDA+NCCL
#
# The library packages are named after their sonames (Debian policy 8.1), one
# soname each. The collective library is not in libstraggler0 so that a
# trainer that only reports pulls no Gloo; the two GPU libraries are apart so
# that the timer (which needs only the NVIDIA driver) pulls neither NCCL nor
# Gloo. No -dev split: the headers and the CMake export of each library are a
# few files, in its package. The python component is pip's (docs/python.md).
#
# Depends come from dpkg-shlibdeps on the packaged ELF files
# (CPACK_DEBIAN_PACKAGE_SHLIBDEPS), not a hand-kept list. The hand entries are
# the project's own packages, `(= version)`: CPack runs dpkg-shlibdeps with
# --ignore-missing-info and without the sibling packages' shlibs, so it finds
# their libraries in the build tree (the private dirs) and names no package for
# them. The same flag makes it name none for libnccl.so.2 (NVIDIA's tarball,
# pip wheel or apt repository, not Debian's): a Recommends instead.
# package:deb checks that every library each packaged ELF file needs is in
# Depends, libnccl alone excepted.

# Example configs under /etc for the package only: an absolute destination
# that `cmake --install BUILD --prefix DIR` leaves alone (EXCLUDE_FROM_ALL), so
# an install into a prefix never writes /etc.
install(FILES deploy/stragglerd.yaml DESTINATION /etc/stragglerd
  COMPONENT etc_config EXCLUDE_FROM_ALL)
install(FILES deploy/straggler-agent.yaml DESTINATION /etc/straggler
  COMPONENT etc_config EXCLUDE_FROM_ALL)
file(WRITE ${PROJECT_BINARY_DIR}/packaging/conffiles
  "/etc/stragglerd/stragglerd.yaml\n/etc/straggler/straggler-agent.yaml\n")

# group -> package name; the groups this build can package.
set(_deb_groups daemon client)
set(_deb_name_daemon stragglerd)
set(_deb_name_client libstraggler0)
set(_deb_name_collective libstraggler-collective0)
set(_deb_name_cuda libstraggler-cuda0)
set(_deb_name_collective_nccl libstraggler-collective-nccl0)
list(APPEND _deb_groups ${STRAGGLER_OPTIONAL_COMPONENTS})
set(STRAGGLER_DEB_PACKAGES "")
foreach(_g ${_deb_groups})
  list(APPEND STRAGGLER_DEB_PACKAGES ${_deb_name_${_g}})
endforeach()

# What Debian policy wants in every package (lintian errors without them):
# /usr/share/doc/<package>/copyright and changelog.gz (a native package's, so
# its date follows SOURCE_DATE_EPOCH when set), in a packaging-only component
# deb_<group>_doc, like etc_config.
string(TIMESTAMP _deb_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
set(_deb_maintainer "stragglerd maintainers <stragglerd@example.com>")
foreach(_g ${_deb_groups})
  set(_pkg ${_deb_name_${_g}})
  set(_dir ${PROJECT_BINARY_DIR}/packaging/doc/${_pkg})
  file(WRITE ${_dir}/changelog "${_pkg} (${PROJECT_VERSION}) unstable; urgency=medium\n\n"
    "  * Built from the stragglerd source tree with CPack (scripts/package.sh).\n\n"
    " -- ${_deb_maintainer}  ${_deb_date}\n")
  execute_process(COMMAND gzip -9nf ${_dir}/changelog)
  configure_file(${PROJECT_SOURCE_DIR}/deploy/debian/copyright ${_dir}/copyright COPYONLY)
  install(FILES ${_dir}/changelog.gz ${_dir}/copyright
    DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${_pkg} COMPONENT deb_${_g}_doc EXCLUDE_FROM_ALL)
endforeach()
# Library packages: ldconfig runs by trigger, once per dpkg run; CPack's
# default postinst and postrm would run it again in each (lintian:
# maintscript-calls-ldconfig). Scripts of our own replace them: nothing to do.
file(WRITE ${PROJECT_BINARY_DIR}/packaging/triggers "activate-noawait ldconfig\n")
foreach(_script postinst postrm)
  file(WRITE ${PROJECT_BINARY_DIR}/packaging/${_script}
    "#!/bin/sh\n# stragglerd's library packages: ldconfig runs through the package's trigger.\nset -e\n")
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
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)
set(CPACK_COMPONENTS_ALL Unspecified deploy etc_config)
foreach(_c Unspecified deploy etc_config)
  string(TOUPPER ${_c} _C)
  set(CPACK_COMPONENT_${_C}_GROUP daemon)
endforeach()
# Each library group holds the install component of its name
# (straggler_install_component; `client` in client_lib/CMakeLists.txt).
foreach(_g ${_deb_groups})
  string(TOUPPER ${_g} _G)
  list(APPEND CPACK_COMPONENTS_ALL deb_${_g}_doc)
  set(CPACK_COMPONENT_DEB_${_G}_DOC_GROUP ${_g})
  set(CPACK_DEBIAN_${_G}_PACKAGE_NAME ${_deb_name_${_g}})
  if(NOT _g STREQUAL "daemon")
    list(APPEND CPACK_COMPONENTS_ALL ${_g})
    set(CPACK_COMPONENT_${_G}_GROUP ${_g})
    set(CPACK_DEBIAN_${_G}_PACKAGE_SECTION libs)
    set(CPACK_DEBIAN_${_G}_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/packaging/triggers
      ${PROJECT_BINARY_DIR}/packaging/postinst ${PROJECT_BINARY_DIR}/packaging/postrm)
  endif()
endforeach()

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The project's libraries, in the build tree, and libnccl where the build found
# it: there dpkg-shlibdeps finds them instead of failing on a library it cannot
# locate (the hand Depends below name their packages).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS
  ${PROJECT_BINARY_DIR}/proto ${PROJECT_BINARY_DIR}/client_lib)
if(STRAGGLER_BUILD_NCCL)
  get_filename_component(_nccl_libdir ${NCCL_LIBRARY} DIRECTORY)
  list(APPEND CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${_nccl_libdir})
endif()
# shlibs with `=`: the 0.x ABI may change in any release. (CPack has no
# per-package switch; stragglerd holds no shared object.)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY "=")
set(_deb_same_client "libstraggler0 (= ${PROJECT_VERSION})")

set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "${_deb_same_client}")
set(CPACK_DEBIAN_DAEMON_DESCRIPTION
  "straggler monitoring daemon for distributed training
stragglerd receives per-step timings from every rank of a training job,
finds the slow ranks and publishes a membership that leaves them out.
This package holds the daemon, the per-node agent, the stragglerctl CLI,
their systemd units and example configuration.")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/packaging/conffiles)

set(CPACK_DEBIAN_CLIENT_DESCRIPTION
  "client library of stragglerd, straggler monitoring for training
libstraggler reports a training rank's step times to stragglerd and reads
back the job's membership. This package holds the shared libraries, the C
and C++ headers and the CMake package config (find_package(straggler)).")

set(CPACK_DEBIAN_COLLECTIVE_PACKAGE_DEPENDS "${_deb_same_client}")
# straggler/gloo_store.h includes Gloo's headers: building against it needs them.
set(CPACK_DEBIAN_COLLECTIVE_PACKAGE_SUGGESTS "libgloo-dev")
set(CPACK_DEBIAN_COLLECTIVE_DESCRIPTION
  "partial all-reduce over Gloo for stragglerd's membership
libstraggler_collective runs an all-reduce among the ranks stragglerd's
membership keeps (PartialAllReduce), over Gloo on the CPU. This package
holds the library, its headers and the CMake component `collective`;
building against it also needs Gloo's headers (libgloo-dev).")

# Not from NEEDED (libstraggler_cuda calls nothing of libstraggler's out of
# line): its header takes a straggler::Client and its CMake export links
# straggler::client, both in libstraggler0.
set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS "${_deb_same_client}")
set(CPACK_DEBIAN_CUDA_DESCRIPTION
  "GPU compute timer for the stragglerd client
libstraggler_cuda times a training step's GPU work with CUDA events and
reports it through libstraggler. The CUDA runtime is linked in; at run
time it needs an NVIDIA driver recent enough for the CUDA version it was
built with. This package holds the library, its headers and the CMake
component `cuda`.")

set(CPACK_DEBIAN_COLLECTIVE_NCCL_PACKAGE_DEPENDS
  "${_deb_same_client}, libstraggler-collective0 (= ${PROJECT_VERSION})")
# libnccl.so.2 is needed but no Debian package ships it: NVIDIA's apt
# repository names it libnccl2; a tarball or pip wheel is no package at all.
set(CPACK_DEBIAN_COLLECTIVE_NCCL_PACKAGE_RECOMMENDS "libnccl2 (>= 2.27)")
set(CPACK_DEBIAN_COLLECTIVE_NCCL_DESCRIPTION
  "NCCL backend of stragglerd's partial all-reduce
libstraggler_collective_nccl runs the partial all-reduce among the ranks
stragglerd's membership keeps on the GPUs, over NCCL (ncclCommShrink).
It needs libnccl.so.2 (NCCL 2.27 or later) on the library path, from
NVIDIA's libnccl2 package, tarball or pip wheel, and an NVIDIA driver.
This package holds the library, its header and the CMake component
`collective_nccl`.")

include(CPack)
