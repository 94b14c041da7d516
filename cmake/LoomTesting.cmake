# Test helpers for loom's own build (not installed).

include("${CMAKE_CURRENT_LIST_DIR}/LoomFailDirectives.cmake")
set(LOOM_RUN_TEST "${CMAKE_CURRENT_LIST_DIR}/LoomRunTest.cmake")

# A test that prints this marker (anywhere in its output) is counted by ctest as skipped, not
# passed: a check that cannot run here says so (loom_add_test and the Catch tests set it).
set(LOOM_SKIP_MARKER "LOOM-SKIPPED: ")

# loom_add_test(NAME <name> [PASS <regex>] [FAILS] [REJECT <regex>] COMMAND <command> [args...])
#   A test whose output must match PASS and whose exit status must be 0 (ctest alone ignores
#   the status of a test with a pass regex): the command runs under cmake/LoomRunTest.cmake,
#   which checks the status. FAILS: the command must exit non-zero, as a refused input does;
#   PASS is then the error message it must print (required: a failure for the wrong reason
#   must not pass). REJECT: output that fails the test even when PASS matched. A first
#   command word that names a target becomes its file, as with add_test. A regex writes a ';'
#   as [;] (a bare one would split it into two regexes, either of which would pass).
function(loom_add_test)
  cmake_parse_arguments(T "FAILS" "NAME;PASS;REJECT" "COMMAND" ${ARGN})
  if(NOT T_NAME OR NOT T_COMMAND)
    message(FATAL_ERROR "loom_add_test: NAME and COMMAND are required")
  endif()
  if(T_FAILS AND NOT T_PASS)
    message(FATAL_ERROR "loom_add_test(${T_NAME}): FAILS needs PASS, the message it must print")
  endif()
  list(GET T_COMMAND 0 first)
  if(TARGET "${first}")
    list(REMOVE_AT T_COMMAND 0)
    list(PREPEND T_COMMAND "$<TARGET_FILE:${first}>")
  endif()
  set(exit zero)
  if(T_FAILS)
    set(exit nonzero)
  endif()
  add_test(NAME ${T_NAME}
           COMMAND ${CMAKE_COMMAND} -DLOOM_TEST_EXIT=${exit} -P ${LOOM_RUN_TEST} -- ${T_COMMAND})
  set(fail "loom-test: FAILED")
  if(T_REJECT)
    list(APPEND fail "${T_REJECT}")
  endif()
  set_tests_properties(${T_NAME} PROPERTIES FAIL_REGULAR_EXPRESSION "${fail}"
                                            SKIP_REGULAR_EXPRESSION "${LOOM_SKIP_MARKER}")
  if(T_PASS)
    set_tests_properties(${T_NAME} PROPERTIES PASS_REGULAR_EXPRESSION "${T_PASS}")
  endif()
endfunction()

# loom_skipped_group(<group> <reason>): a group of tests this configuration cannot register
# (what it needs was not found) shows in ctest as the skipped test skipped.<group>, its reason
# in the output. scripts/test.sh fails on one: scripts/deps.sh installs what every group needs.
function(loom_skipped_group group reason)
  add_test(NAME skipped.${group} COMMAND ${CMAKE_COMMAND} -E echo "${LOOM_SKIP_MARKER}${reason}")
  set_tests_properties(skipped.${group} PROPERTIES LABELS skipped
                       SKIP_REGULAR_EXPRESSION "${LOOM_SKIP_MARKER}")
  message(STATUS "loom: tests ${group} not registered: ${reason}")
endfunction()

# loom_add_compile_fail_test(<file.fail.cpp>)
#   The file holds one `// expect-error: <regex>` line. Built with LOOM_FAIL defined it must
#   fail with output matching <regex> (a loom message, never compiler wording); built without,
#   it must compile: that twin is part of the normal build (with LOOM_BUILD_COMPILE_CHECKS).
#   An optional `// reject-error: <regex>` line names output that must not appear (a cascade of
#   further errors after the one that explains the mistake). Each directive is a line of its
#   own (.clang-format never wraps them); one that is not stops the configure
#   (cmake/LoomFailDirectives.cmake). Files may include "support/...".
#   The LOOM_FAIL builds run at test time, where the compiler cache cannot help (a failed
#   compile is never cached): they reuse one precompiled header of the LibTorch headers that
#   loom includes (target loom_cf_pch, part of the normal build), so each parses only loom.
#   loom's own headers stay out of it: each test sees exactly what it includes.
set(LOOM_CF_PCH_HEADERS
  <ATen/core/Tensor.h> <ATen/core/ivalue.h> <ATen/Context.h> <ATen/autocast_mode.h>
  <ATen/ops/full.h> <ATen/ops/_amp_update_scale.h>
  <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h> <c10/core/Device.h>
  <c10/core/DeviceType.h> <c10/core/ScalarType.h> <c10/core/GradMode.h>
  <c10/core/TensorOptions.h> <c10/util/Exception.h> <c10/util/Half.h> <c10/util/BFloat16.h>
  <torch/types.h> <torch/utils.h> <torch/nn/module.h> <torch/nn/utils/clip_grad.h>
  <torch/optim/optimizer.h> <torch/optim/sgd.h> <torch/optim/adam.h> <torch/optim/adamw.h>
  <torch/data/example.h> <torch/serialize/archive.h>)

# loom_pch_library(<name> HEADERS <header>... [LINK <target>...] [INCLUDE <dir>...]
#                  [OPTIONS <flag>...]): once, an object library of one empty source whose
#   precompiled header of <header>... other targets reuse (REUSE_FROM <name>), compiled with
#   loom::loom and the given links, include directories and flags (a reusing target's must
#   match them).
function(loom_pch_library name)
  cmake_parse_arguments(P "" "" "HEADERS;LINK;INCLUDE;OPTIONS" ${ARGN})
  if(TARGET ${name})
    return()
  endif()
  file(CONFIGURE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/${name}.cpp" CONTENT "\n")
  add_library(${name} OBJECT "${CMAKE_CURRENT_BINARY_DIR}/${name}.cpp")
  target_link_libraries(${name} PRIVATE loom::loom ${P_LINK})
  target_include_directories(${name} PRIVATE ${P_INCLUDE})
  target_compile_options(${name} PRIVATE ${P_OPTIONS})
  target_precompile_headers(${name} PRIVATE ${P_HEADERS})
endfunction()

function(loom_compile_fail_pch)
  loom_pch_library(loom_cf_pch HEADERS ${LOOM_CF_PCH_HEADERS}
                   INCLUDE "${PROJECT_SOURCE_DIR}/tests")
endfunction()

function(loom_add_compile_fail_test file)
  get_filename_component(name "${file}" NAME_WE)
  loom_read_fail_directives("${file}" regex reject_regex)
  string(REPLACE ";" "[;]" regex "${regex}")
  string(REPLACE ";" "[;]" reject_regex "${reject_regex}")

  if(LOOM_BUILD_COMPILE_CHECKS)
    add_library(loom_cf_${name}_twin OBJECT "${file}")
    target_link_libraries(loom_cf_${name}_twin PRIVATE loom::loom loom_warnings)
    target_include_directories(loom_cf_${name}_twin PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  endif()

  add_library(loom_cf_${name} OBJECT EXCLUDE_FROM_ALL "${file}")
  target_link_libraries(loom_cf_${name} PRIVATE loom::loom)
  target_include_directories(loom_cf_${name} PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  target_compile_definitions(loom_cf_${name} PRIVATE LOOM_FAIL)
  loom_compile_fail_pch()
  target_precompile_headers(loom_cf_${name} REUSE_FROM loom_cf_pch)
  loom_add_test(NAME compile_fail.${name} FAILS PASS "${regex}" REJECT "${reject_regex}"
    COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target loom_cf_${name})
  set_tests_properties(compile_fail.${name} PROPERTIES
    LABELS compile_fail
    RESOURCE_LOCK loom_build_tree)
endfunction()

# loom_add_header_tests(<target> <include-dir>)
#   One translation unit per header under <include-dir>/loom (detail/ too), each including
#   its header alone, all linked into one executable: each header compiles by itself, and
#   no header defines a non-inline symbol twice.
function(loom_add_header_tests target include_dir)
  file(GLOB_RECURSE headers RELATIVE "${include_dir}" CONFIGURE_DEPENDS "${include_dir}/loom/*.hpp")
  set(sources)
  foreach(h IN LISTS headers)
    string(MAKE_C_IDENTIFIER "${h}" id)
    set(src "${CMAKE_CURRENT_BINARY_DIR}/headers/${id}.cpp")
    file(CONFIGURE OUTPUT "${src}" CONTENT "#include <${h}>\n#include <${h}>\n")
    list(APPEND sources "${src}")
  endforeach()
  set(main "${CMAKE_CURRENT_BINARY_DIR}/headers/main.cpp")
  file(CONFIGURE OUTPUT "${main}" CONTENT "int main() { return 0; }\n")
  add_executable(${target} ${sources} "${main}")
  target_link_libraries(${target} PRIVATE loom::loom loom_warnings)
  # LibTorch's headers precompiled (LOOM_CF_PCH_HEADERS, as the compile-fail tests have them):
  # each of these translation units then parses only loom, in seconds instead of LibTorch's
  # ten. What this check guards is loom's own include graph; a loom header that forgot a
  # LibTorch header the list holds would pass here (the tests that include it still parse it).
  target_precompile_headers(${target} PRIVATE ${LOOM_CF_PCH_HEADERS})
  add_test(NAME headers.compile_alone COMMAND ${target})
  set_tests_properties(headers.compile_alone PROPERTIES LABELS headers)
endfunction()

# How the programs of loom's own build compile: the tests, the test programs, the examples and
# the docs' code blocks (never the library, the install tests' consumers or the benchmarks,
# which keep the build type's flags). A program that includes LibTorch spends about 40 s
# parsing LibTorch's and loom's headers and as long again optimising at -O3; scripts/test.sh
# builds its GCC half with both settings below (docs/testing.md has the figures).
#   LOOM_TEST_OPTIMIZATION  a flag such as -O1 appended to these programs' flags (empty: the
#                           build type's own)
#   LOOM_TEST_PCH           one precompiled header of <torch/torch.h> and <loom/loom.hpp>
#                           (target loom_test_pch) that the tests, test programs and docs'
#                           blocks reuse. Each then sees all of loom: what a loom header itself
#                           includes is checked by the header tests (which keep their own
#                           precompiled header) and by the examples, which never use it.
set(LOOM_TEST_OPTIMIZATION "" CACHE STRING
    "Optimisation flag of loom's tests and examples (empty: the build type's)")
option(LOOM_TEST_PCH "Build loom's tests and examples on one precompiled header" OFF)

# loom_test_programs([NO_PCH]): applies the two settings to every executable and object
# library this directory defined that links loom::loom or loom::dist, has no precompiled header of its own
# and is not instrumented (the fuzzers). NO_PCH: LOOM_TEST_OPTIMIZATION only (the examples,
# which compile as a user's program does, each with its own includes).
function(loom_test_programs)
  cmake_parse_arguments(T "NO_PCH" "" "" ${ARGN})
  get_property(targets DIRECTORY PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    get_target_property(links ${t} LINK_LIBRARIES)
    get_target_property(pch ${t} PRECOMPILE_HEADERS)
    get_target_property(reuse ${t} PRECOMPILE_HEADERS_REUSE_FROM)
    get_target_property(options ${t} COMPILE_OPTIONS)
    get_target_property(excluded ${t} EXCLUDE_FROM_ALL)
    if(NOT type MATCHES "^(EXECUTABLE|OBJECT_LIBRARY)$"
       OR NOT ("loom::loom" IN_LIST links OR "loom::dist" IN_LIST links)
       OR pch OR reuse OR excluded OR "${options}" MATCHES "-fsanitize")
      continue()
    endif()
    if(LOOM_TEST_OPTIMIZATION)
      target_compile_options(${t} PRIVATE ${LOOM_TEST_OPTIMIZATION})
    endif()
    if(LOOM_TEST_PCH AND NOT T_NO_PCH)
      loom_test_pch()
      target_precompile_headers(${t} REUSE_FROM loom_test_pch)
    endif()
  endforeach()
endfunction()

function(loom_test_pch)
  loom_pch_library(loom_test_pch HEADERS <torch/torch.h> <loom/loom.hpp> LINK loom_warnings
                   OPTIONS ${LOOM_TEST_OPTIMIZATION})
endfunction()
