# The build's link graph as a text file, for layout:tool_links
# (tests/layout/tool_links_check.py): one line per target the project defines,
#
#   <target> TAB <its folder, relative to the source root> TAB <link;link;...>
#
# with the libraries it links (LINK_LIBRARIES and, for what links it,
# INTERFACE_LINK_LIBRARIES), aliases resolved to their targets and
# $<LINK_ONLY:...> unwrapped. Call once every target exists (tests/ is added
# last). Written at configure time, so the check reads what the build knows
# rather than a list kept by hand.
function(_straggler_link_table_dir dir out_var)
  set(lines "")
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "UTILITY" OR type STREQUAL "GLOBAL_TARGET")
      continue()
    endif()
    get_target_property(src ${t} SOURCE_DIR)
    file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${src}")
    set(links "")
    foreach(prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
      get_target_property(items ${t} ${prop})
      if(NOT items)
        continue()
      endif()
      foreach(item IN LISTS items)
        string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" item "${item}")
        if(TARGET "${item}")
          get_target_property(aliased "${item}" ALIASED_TARGET)
          if(aliased)
            set(item "${aliased}")
          endif()
        endif()
        list(APPEND links "${item}")
      endforeach()
    endforeach()
    list(REMOVE_DUPLICATES links)
    string(APPEND lines "${t}\t${rel}\t${links}\n")
  endforeach()
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _straggler_link_table_dir("${sub}" sub_lines)
    string(APPEND lines "${sub_lines}")
  endforeach()
  set(${out_var} "${lines}" PARENT_SCOPE)
endfunction()

function(straggler_write_link_table file)
  _straggler_link_table_dir("${PROJECT_SOURCE_DIR}" lines)
  file(WRITE "${file}" "${lines}")
endfunction()
