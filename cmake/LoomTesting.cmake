# Test helpers for loom's own build (not installed).

# loom_add_compile_fail_test(<file.fail.cpp>)
#   The file holds one `// expect-error: <regex>` line. Built with LOOM_FAIL defined it must
#   fail with output matching <regex> (a loom message, never compiler wording); built without,
#   it must compile: that twin is part of the normal build. An optional
#   `// reject-error: <regex>` line names output that must not appear (a cascade of further
#   errors after the one that explains the mistake). Files may include "support/...".
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
function(loom_compile_fail_pch)
  if(TARGET loom_cf_pch)
    return()
  endif()
  file(CONFIGURE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/loom_cf_pch.cpp" CONTENT "\n")
  add_library(loom_cf_pch OBJECT "${CMAKE_CURRENT_BINARY_DIR}/loom_cf_pch.cpp")
  target_link_libraries(loom_cf_pch PRIVATE loom::loom)
  target_include_directories(loom_cf_pch PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  target_precompile_headers(loom_cf_pch PRIVATE ${LOOM_CF_PCH_HEADERS})
endfunction()

function(loom_add_compile_fail_test file)
  get_filename_component(name "${file}" NAME_WE)
  file(STRINGS "${file}" expect REGEX "^// expect-error: ")
  list(LENGTH expect n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "${file}: needs exactly one '// expect-error: <regex>' line")
  endif()
  string(REGEX REPLACE "^// expect-error: " "" regex "${expect}")
  file(STRINGS "${file}" reject REGEX "^// reject-error: ")
  string(REGEX REPLACE "^// reject-error: " "" reject_regex "${reject}")

  add_library(loom_cf_${name}_twin OBJECT "${file}")
  target_link_libraries(loom_cf_${name}_twin PRIVATE loom::loom loom_warnings)
  target_include_directories(loom_cf_${name}_twin PRIVATE "${PROJECT_SOURCE_DIR}/tests")

  add_library(loom_cf_${name} OBJECT EXCLUDE_FROM_ALL "${file}")
  target_link_libraries(loom_cf_${name} PRIVATE loom::loom)
  target_include_directories(loom_cf_${name} PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  target_compile_definitions(loom_cf_${name} PRIVATE LOOM_FAIL)
  loom_compile_fail_pch()
  target_precompile_headers(loom_cf_${name} REUSE_FROM loom_cf_pch)
  add_test(NAME compile_fail.${name}
           COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target loom_cf_${name})
  set_tests_properties(compile_fail.${name} PROPERTIES
    PASS_REGULAR_EXPRESSION "${regex}"
    LABELS compile_fail
    RESOURCE_LOCK loom_build_tree)
  if(reject_regex)
    set_tests_properties(compile_fail.${name} PROPERTIES FAIL_REGULAR_EXPRESSION "${reject_regex}")
  endif()
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
  add_test(NAME headers.compile_alone COMMAND ${target})
  set_tests_properties(headers.compile_alone PROPERTIES LABELS headers)
endfunction()
