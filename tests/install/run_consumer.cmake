# Builds and runs tests/install/consumer against loom, as a user's project would.
#   MODE=find_package:     install loom into WORK_DIR/prefix, then find_package(loom)
#   MODE=add_subdirectory: the consumer adds loom's source tree
file(REMOVE_RECURSE "${WORK_DIR}")
set(args -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release -DTorch_DIR=${Torch_DIR}
         -DCMAKE_CXX_COMPILER_LAUNCHER=${COMPILER_LAUNCHER})
if(MODE STREQUAL "find_package")
  execute_process(COMMAND ${CMAKE_COMMAND} --install "${LOOM_BINARY_DIR}" --prefix "${WORK_DIR}/prefix"
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "installing loom failed")
  endif()
  list(APPEND args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCONSUMER_MODE=find_package)
else()
  list(APPEND args -DLOOM_SOURCE_DIR=${LOOM_SOURCE_DIR} -DCONSUMER_MODE=add_subdirectory)
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${CMAKE_CURRENT_LIST_DIR}/consumer" -B "${WORK_DIR}/build" ${args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer failed:\n${out}\n${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer failed:\n${out}\n${err}")
endif()
execute_process(COMMAND "${WORK_DIR}/build/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer failed")
endif()
