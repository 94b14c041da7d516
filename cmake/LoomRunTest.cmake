# Runs one test command and checks its exit status (loom_add_test in LoomTesting.cmake):
#   cmake -DLOOM_TEST_EXIT=zero|nonzero -P LoomRunTest.cmake -- <command> [args...]
# The command's output goes to ctest as it is; ctest matches it against the test's
# PASS_REGULAR_EXPRESSION. A status other than the one expected prints a line with
# "loom-test: FAILED", which the test's FAIL_REGULAR_EXPRESSION matches: the test fails even
# when its pass text was printed. Signals count as a non-zero status, but never as the failure
# a test expects (a crash is not an error message).
set(command)
set(seen_separator FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE 1 ${last})
  if(seen_separator)
    string(REPLACE ";" "\\;" arg "${CMAKE_ARGV${i}}")  # one argument, even with a ';'
    list(APPEND command "${arg}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(seen_separator TRUE)
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "loom-test: FAILED: no command after --")
endif()
execute_process(COMMAND ${command} RESULT_VARIABLE status)
if(LOOM_TEST_EXIT STREQUAL "nonzero")
  if(status MATCHES "^[1-9][0-9]*$")
    return()
  endif()
  message(FATAL_ERROR "loom-test: FAILED: the command exited with status '${status}'; this "
                      "test expects it to fail with an error message (a non-zero exit status)")
endif()
if(NOT status STREQUAL "0")
  message(FATAL_ERROR "loom-test: FAILED: the command exited with status '${status}' "
                      "(expected 0)")
endif()
