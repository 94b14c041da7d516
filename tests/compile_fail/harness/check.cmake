# The compile-fail harness' own test (test compile_fail.harness): the directive parser
# (cmake/LoomFailDirectives.cmake) reads a well-formed file and stops the configure on each
# malformed one, naming what is wrong.
#   cmake -DPARSER=<LoomFailDirectives.cmake> -DDIR=<this folder> -P check.cmake
set(failures 0)
function(expect_parse fixture want_ok want_text)
  execute_process(COMMAND ${CMAKE_COMMAND} -DFILE=${DIR}/${fixture} -P ${PARSER}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(REGEX REPLACE "[ \n]+" " " out "${out}")  # CMake wraps its error messages
  if((want_ok AND NOT rc STREQUAL "0") OR (NOT want_ok AND rc STREQUAL "0"))
    message("harness: ${fixture}: exit status ${rc}, expected the parser "
            "to accept it only if well formed: ${out}")
    math(EXPR n "${failures} + 1")
    set(failures ${n} PARENT_SCOPE)
  elseif(NOT out MATCHES "${want_text}")
    message("harness: ${fixture}: output does not match '${want_text}': ${out}")
    math(EXPR n "${failures} + 1")
    set(failures ${n} PARENT_SCOPE)
  else()
    message("harness: ${fixture}: ok")
  endif()
endfunction()
expect_parse(good.fail.txt TRUE
             "expect-error: the Device argument is torch::Device .* Common mistake reject-error: it lacks")
expect_parse(wrapped.fail.txt FALSE "not a line of its own: '// Common mistake reject-error: it lacks'")
expect_parse(none.fail.txt FALSE "needs exactly one '// expect-error: <regex>' line, has 0")
expect_parse(two.fail.txt FALSE "needs exactly one '// expect-error: <regex>' line, has 2")
if(failures GREATER 0)
  message(FATAL_ERROR "harness: ${failures} fixture(s) not handled as expected")
endif()
message("compile_fail harness: ok")
