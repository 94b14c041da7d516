# The loom::tensorboard library (see the top-level CMakeLists.txt): loom::TensorBoardLogger.
# Its event messages (src/loggers/tensorboard_event.proto) are compiled by protoc and encoded
# by libprotobuf-lite.
find_package(Protobuf QUIET)
if(NOT Protobuf_FOUND OR NOT TARGET protobuf::libprotobuf-lite OR NOT Protobuf_PROTOC_EXECUTABLE)
  message(STATUS "loom: loom::tensorboard (TensorBoardLogger) is off: Protobuf was not found "
                 "(Debian: libprotobuf-dev, protobuf-compiler)")
  return()
endif()
set(_loom_tb_out "${PROJECT_BINARY_DIR}/generated/loggers")
file(MAKE_DIRECTORY "${_loom_tb_out}")
add_custom_command(
  OUTPUT "${_loom_tb_out}/tensorboard_event.pb.cc" "${_loom_tb_out}/tensorboard_event.pb.h"
  COMMAND ${Protobuf_PROTOC_EXECUTABLE} --cpp_out=${_loom_tb_out}
          -I${PROJECT_SOURCE_DIR}/src/loggers tensorboard_event.proto
  DEPENDS "${PROJECT_SOURCE_DIR}/src/loggers/tensorboard_event.proto"
  COMMENT "protoc: tensorboard_event.proto"
  VERBATIM)
add_library(loom_tensorboard STATIC src/loggers/tensorboard_logger.cpp
                                    "${_loom_tb_out}/tensorboard_event.pb.cc")
add_library(loom::tensorboard ALIAS loom_tensorboard)
set_target_properties(loom_tensorboard PROPERTIES EXPORT_NAME tensorboard
                                                  POSITION_INDEPENDENT_CODE ON)
target_link_libraries(loom_tensorboard PUBLIC loom PRIVATE protobuf::libprotobuf-lite)
target_include_directories(loom_tensorboard PRIVATE "${_loom_tb_out}")
if(LOOM_WARNINGS)
  # The generated code is protoc's: loom's warnings apply to loom's file only.
  set_source_files_properties(src/loggers/tensorboard_logger.cpp PROPERTIES
    COMPILE_OPTIONS "${LOOM_WARNING_FLAGS}")
endif()
message(STATUS "loom: loom::tensorboard with protobuf ${Protobuf_VERSION}")
