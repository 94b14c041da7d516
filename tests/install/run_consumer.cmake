# Uses loom as a project would: cmake -P run_consumer.cmake with
#   MODE=find_package      install loom (from LOOM_BINARY_DIR) into WORK_DIR/prefix; the consumer
#                          finds Torch through Torch_DIR, then loom; build and run it
#   MODE=cxx20             the same install; the consumer, with set(CMAKE_CXX_STANDARD 20), finds
#                          loom alone (README's snippet), which finds Torch through Torch_DIR, with
#                          TORCH_CUDA_ARCH_LIST unset so that LibTorch's config runs its CUDA probe;
#                          build and run it
#   MODE=wheel             the same install; the consumer includes LoomTorchWheel.cmake from it,
#                          which finds the wheel in LOOM_VENV (no Torch_DIR); build and run it
#   MODE=add_subdirectory  the consumer adds LOOM_SOURCE_DIR; build and run it
#   MODE=no_torch          the same install; find_package(loom QUIET) where find_package cannot
#                          find Torch (Torch_DIR=/nonexistent, nothing but loom on
#                          CMAKE_PREFIX_PATH) although the wheel lies where LoomTorchWheel.cmake
#                          would look (LOOM_VENV, ~/.cache/loom): the package config must not
#                          look there; configure only
#   MODE=standalone        configure LOOM_SOURCE_DIR alone with tests and examples off and Catch2
#                          and CLI11 unfindable, build, install into WORK_DIR/prefix, check it
# Also: GENERATOR, CXX_COMPILER, COMPILER_LAUNCHER, Torch_DIR, LOOM_VENV, LOOM_TORCH_VERSION,
# WARNINGS and WERROR (loom's LOOM_WARNINGS and LOOM_WERROR).
# standalone and add_subdirectory compile loom's sources again, with the flags of the build
# that runs the test (LOOM_WARNINGS, LOOM_WERROR) and in a build directory beside it
# (<build>-standalone, <build>-add_subdirectory), removed when the test passes: each compile
# line then reads as the same line of that build, relative to the checkout, and the compiler
# cache (ccache, CCACHE_BASEDIR: scripts/lib.sh) answers it instead of compiling loom twice more.
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
set(loom_flags -DLOOM_WARNINGS=${WARNINGS} -DLOOM_WERROR=${WERROR})
if(MODE MATCHES "^(standalone|add_subdirectory)$")
  set(build "${LOOM_BINARY_DIR}-${MODE}")
  file(REMOVE_RECURSE "${build}")
endif()
set(common -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
if(COMPILER_LAUNCHER)
  list(APPEND common -DCMAKE_CXX_COMPILER_LAUNCHER=${COMPILER_LAUNCHER})
endif()
# Nothing from the caller's environment may point find_package at Torch.
set(clean_env ${CMAKE_COMMAND} -E env --unset=CMAKE_PREFIX_PATH --unset=Torch_DIR
              --unset=Torch_ROOT --unset=TORCH_ROOT --unset=LOOM_VENV --unset=LOOM_HOME)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed:\n${out}\n${err}")
  endif()
  set(out "${out}${err}" PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "standalone")
  run("configuring loom" ${CMAKE_COMMAND} -S "${LOOM_SOURCE_DIR}" -B "${build}" ${common}
      -DTorch_DIR=${Torch_DIR} -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_EXAMPLES=OFF ${loom_flags}
      -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON)
  run("building loom" ${CMAKE_COMMAND} --build "${build}")
  run("installing loom" ${CMAKE_COMMAND} --install "${build}" --prefix "${prefix}")
  foreach(f include/loom/loom.hpp share/cmake/loom/loomConfig.cmake
            share/cmake/loom/loomConfigVersion.cmake share/cmake/loom/loomTargets.cmake
            share/cmake/loom/LoomTorchWheel.cmake)
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "the install lacks ${f}")
    endif()
  endforeach()
  file(GLOB_RECURSE files "${prefix}/*")
  list(LENGTH files n)
  message("install: loom installed ${n} files without Catch2 and CLI11")
  file(REMOVE_RECURSE "${build}")  # passed: the directory beside the build goes
  return()
endif()

if(MODE STREQUAL "add_subdirectory")
  set(args -DCONSUMER_MODE=add_subdirectory -DLOOM_SOURCE_DIR=${LOOM_SOURCE_DIR}
           -DTorch_DIR=${Torch_DIR} ${loom_flags})
else()
  run("installing loom" ${CMAKE_COMMAND} --install "${LOOM_BINARY_DIR}" --prefix "${prefix}")
  set(args -DCONSUMER_MODE=${MODE} -DCMAKE_PREFIX_PATH=${prefix})
  if(MODE STREQUAL "find_package")
    list(APPEND args -DTorch_DIR=${Torch_DIR})
  elseif(MODE STREQUAL "cxx20")
    list(APPEND args -DTorch_DIR=${Torch_DIR})
    set(clean_env ${clean_env} --unset=TORCH_CUDA_ARCH_LIST)
  elseif(MODE STREQUAL "wheel")
    list(APPEND args -DLOOM_CMAKE_DIR=${prefix}/share/cmake/loom
                     -DLOOM_TORCH_VERSION=${LOOM_TORCH_VERSION})
    if(LOOM_VENV)
      set(clean_env ${clean_env} LOOM_VENV=${LOOM_VENV})
    endif()
  elseif(MODE STREQUAL "no_torch")
    list(APPEND args -DTorch_DIR=/nonexistent)
    if(LOOM_VENV)
      set(clean_env ${clean_env} LOOM_VENV=${LOOM_VENV})
    endif()
  else()
    message(FATAL_ERROR "MODE: find_package, cxx20, wheel, add_subdirectory, no_torch or "
                        "standalone")
  endif()
endif()

run("configuring the consumer" ${clean_env} ${CMAKE_COMMAND}
    -S "${CMAKE_CURRENT_LIST_DIR}/consumer" -B "${build}" ${common} ${args})
if(MODE STREQUAL "no_torch")
  string(REGEX MATCH "consumer: loom_FOUND is [a-z]+" found "${out}")
  message("${found}")
  return()
endif()
if(MODE STREQUAL "wheel" AND NOT out MATCHES "loom: LibTorch from the torch wheel in ")
  message(FATAL_ERROR "LoomTorchWheel.cmake did not find the wheel itself:\n${out}")
endif()
run("building the consumer" ${CMAKE_COMMAND} --build "${build}")
run("the consumer" "${build}/consumer")
message("${out}")
if(MODE STREQUAL "add_subdirectory")
  file(REMOVE_RECURSE "${build}")  # passed: the directory beside the build goes
endif()
