# The loom::dist library (see the top-level CMakeLists.txt): dist::ProcessGroup's, loom::Ddp's
# and loom::Zero's definitions.
# Without gloo's headers loom::dist turns itself off (a status line, never an error, so that a
# parent project's configure goes on): no target loom_dist, and what uses it checks for it.
find_path(LOOM_GLOO_INCLUDE_DIR gloo/algorithm.h DOC "gloo's headers (headers only)")
if(NOT LOOM_GLOO_INCLUDE_DIR)
  message(STATUS "loom: loom::dist (loom::Ddp) is off: gloo's headers were not found "
                 "(Debian: libgloo-dev; headers only, its library is never linked). Install "
                 "them, or set LOOM_GLOO_INCLUDE_DIR to the folder that holds "
                 "gloo/algorithm.h; -DLOOM_BUILD_DIST=OFF silences this line.")
  return()
endif()
set(_loom_dist "${PROJECT_SOURCE_DIR}/src/dist")
add_library(loom_dist STATIC
            ${_loom_dist}/comm_hooks.cpp ${_loom_dist}/ddp.cpp ${_loom_dist}/environment.cpp
            ${_loom_dist}/gloo.cpp ${_loom_dist}/join.cpp ${_loom_dist}/nccl.cpp
            ${_loom_dist}/process_group.cpp ${_loom_dist}/rendezvous.cpp ${_loom_dist}/roll_call.cpp
            ${_loom_dist}/zero.cpp ${_loom_dist}/zero_checkpoint.cpp ${_loom_dist}/fsdp.cpp
            ${_loom_dist}/fsdp_unit.cpp ${_loom_dist}/fsdp_checkpoint.cpp)
add_library(loom::dist ALIAS loom_dist)
set_target_properties(loom_dist PROPERTIES EXPORT_NAME dist POSITION_INDEPENDENT_CODE ON)
target_link_libraries(loom_dist PUBLIC loom)
if(LOOM_WARNINGS)
  target_link_libraries(loom_dist PRIVATE $<BUILD_INTERFACE:loom_warnings>)
endif()
# Only gloo.cpp sees gloo's headers (a system directory is already searched).
if(NOT LOOM_GLOO_INCLUDE_DIR STREQUAL "/usr/include")
  set_source_files_properties(${_loom_dist}/gloo.cpp PROPERTIES
    COMPILE_OPTIONS "-isystem;${LOOM_GLOO_INCLUDE_DIR}")
endif()
# NCCL: the torch wheel's nvidia-nccl package has nccl.h; without it (or without torch_cuda)
# the nccl backend reports that it was not built.
set(_loom_nccl 0)
if(TARGET torch_cuda)
  find_path(LOOM_NCCL_INCLUDE_DIR nccl.h
            HINTS "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include" NO_DEFAULT_PATH)
  if(LOOM_NCCL_INCLUDE_DIR)
    set(_loom_nccl 1)
    set_source_files_properties(${_loom_dist}/nccl.cpp PROPERTIES
      COMPILE_OPTIONS "-isystem;${LOOM_NCCL_INCLUDE_DIR}")
  endif()
endif()
set_property(SOURCE ${_loom_dist}/nccl.cpp APPEND PROPERTY COMPILE_DEFINITIONS
             LOOM_DIST_NCCL=${_loom_nccl})
message(STATUS "loom: loom::dist with gloo (headers: ${LOOM_GLOO_INCLUDE_DIR}), "
               "nccl ${_loom_nccl}")
