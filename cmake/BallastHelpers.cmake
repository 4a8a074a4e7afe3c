# Helpers shared by every folder of the tree.

# Add every direct subdirectory of `dir` that has a CMakeLists.txt; a folder
# without one is searched one level deeper (plugins/detector/machine).
function(ballast_add_all_subdirs dir)
  file(GLOB children RELATIVE "${CMAKE_CURRENT_SOURCE_DIR}/${dir}" "${CMAKE_CURRENT_SOURCE_DIR}/${dir}/*")
  list(SORT children)
  foreach(child IN LISTS children)
    set(path "${dir}/${child}")
    if(IS_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/${path}")
      if(EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/${path}/CMakeLists.txt")
        add_subdirectory("${path}")
      else()
        ballast_add_all_subdirs("${path}")
      endif()
    endif()
  endforeach()
endfunction()

# ballast_add_plugin(NAME SOURCES src... [LIBRARIES lib...])
# Builds ballast-NAME.so into the plugin folder of the build tree and installs
# it. A plugin links the ABI headers only (plus its own third-party
# libraries): -z defs makes any use of a core symbol a link error.
function(ballast_add_plugin name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBRARIES" ${ARGN})
  set(target ballast-${name})
  add_library(${target} MODULE ${P_SOURCES})
  target_link_libraries(${target} PRIVATE Ballast::abi ${P_LIBRARIES})
  target_link_options(${target} PRIVATE -Wl,-z,defs)
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME ballast-${name}
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY "${BALLAST_PLUGIN_OUTPUT_DIR}")
  install(TARGETS ${target} LIBRARY DESTINATION "${BALLAST_PLUGIN_INSTALL_DIR}")
endfunction()

# ballast_add_test(NAME SOURCES src... [LIBRARIES lib...] [LABELS l...] [TIMEOUT s] [COST s])
# A doctest executable (main() comes from ballast_doctest_main: never define
# DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN in a test) registered with ctest. Exit code 77 means skipped
# (a test that needs a GPU or a kernel feature this machine lacks). COST, for
# the tests that run longest: about the seconds one takes in the asan preset;
# ctest starts them first when it has no timing history of its own (a fresh
# CI machine), so that none is left running alone at the end.
function(ballast_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT;COST" "SOURCES;LIBRARIES;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ballast_doctest_main ${T_LIBRARIES})
  target_compile_definitions(${name} PRIVATE
    BALLAST_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    BALLAST_BINARY_DIR="${PROJECT_BINARY_DIR}"
    BALLAST_PLUGIN_DIR="${BALLAST_PLUGIN_OUTPUT_DIR}"
    BALLAST_EXE="${PROJECT_BINARY_DIR}/${CMAKE_INSTALL_BINDIR}/ballast")
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/tests")
  add_test(NAME ${name} COMMAND ${name})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  # Each test's scratch files (temp_directory_path, mkdtemp) go to a folder
  # of its own in the build tree, not /tmp: what a test leaves behind goes
  # with the build, and tests running at once cannot collide.
  set(scratch "${PROJECT_BINARY_DIR}/tests/tmp/${name}")
  file(MAKE_DIRECTORY "${scratch}")
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT ${T_TIMEOUT}
    WORKING_DIRECTORY "${PROJECT_BINARY_DIR}/tests" ENVIRONMENT "TMPDIR=${scratch}")
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
  if(T_COST)
    set_tests_properties(${name} PROPERTIES COST ${T_COST})
  endif()
endfunction()

# ballast_add_bench(NAME SOURCES src... [LIBRARIES lib...])
function(ballast_add_bench name)
  cmake_parse_arguments(B "" "" "SOURCES;LIBRARIES" ${ARGN})
  add_executable(${name} ${B_SOURCES})
  # Every benchmark answers --help and refuses unknown options the way the
  # `ballast` commands do (plugins/common/command_line.hpp).
  target_link_libraries(${name} PRIVATE ${B_LIBRARIES} ballast_plugin_common)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/bench")
  set_property(GLOBAL APPEND PROPERTY BALLAST_BENCHES ${name})
endfunction()
