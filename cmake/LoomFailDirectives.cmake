# The directives of a compile-fail test (tests/compile_fail/*.fail.cpp), each a line of its own:
#   // expect-error: <regex>    exactly one: the loom message the failed build must print
#   // reject-error: <regex>    at most one: output that must not appear (a cascade of errors)
# loom_read_fail_directives(<file> <expect-var> <reject-var>) stops the configure with an error
# naming the line when a directive is not at the start of its line (a formatter wrapped it),
# when there is no expect-error line or more than one of either kind: a directive that cannot
# be read is never ignored.
# As a script it checks one file and prints what it read (the harness test runs it so):
#   cmake -DFILE=<file> -P LoomFailDirectives.cmake
function(loom_read_fail_directives file expect_var reject_var)
  file(STRINGS "${file}" lines REGEX "(expect|reject)-error:")
  # Counted, not collected in lists: a regex may hold a ';'.
  set(expect "")
  set(reject "")
  set(n_expect 0)
  set(n_reject 0)
  foreach(line IN LISTS lines)
    if(line MATCHES "^// expect-error: (.+)$")
      set(expect "${CMAKE_MATCH_1}")
      math(EXPR n_expect "${n_expect} + 1")
    elseif(line MATCHES "^// reject-error: (.+)$")
      set(reject "${CMAKE_MATCH_1}")
      math(EXPR n_reject "${n_reject} + 1")
    else()
      message(FATAL_ERROR "${file}: a compile-fail directive that is not a line of its own: "
                          "'${line}' (each '// expect-error: <regex>' or '// reject-error: "
                          "<regex>' must start its line and hold its whole regex)")
    endif()
  endforeach()
  if(NOT n_expect EQUAL 1)
    message(FATAL_ERROR "${file}: needs exactly one '// expect-error: <regex>' line, has "
                        "${n_expect}")
  endif()
  if(n_reject GREATER 1)
    message(FATAL_ERROR "${file}: has ${n_reject} '// reject-error:' lines; join them into one "
                        "regex with |")
  endif()
  set(${expect_var} "${expect}" PARENT_SCOPE)
  set(${reject_var} "${reject}" PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE AND DEFINED FILE)
  loom_read_fail_directives("${FILE}" expect reject)
  message("expect-error: ${expect}")
  message("reject-error: ${reject}")
endif()
