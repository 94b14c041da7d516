# LoomTorchWheel: LibTorch from the PyPI torch wheel, for projects that ask for it.
#
# loom's package config only runs find_dependency(Torch): a project that uses loom finds
# LibTorch by its own means (Torch_DIR, CMAKE_PREFIX_PATH, ...). This module is the opt-in
# alternative that loom's own build uses: it finds the torch wheel in a Python virtual
# environment, as loom's scripts/deps.sh installs it, and makes executables link against the
# wheel's CUDA libraries. It is installed next to loom's package config. Including it defines
# the commands below and sets nothing else.
#
#   list(APPEND CMAKE_MODULE_PATH <prefix>/share/cmake/loom)  # or <loom's source tree>/cmake
#   include(LoomTorchWheel)
#   loom_torch_wheel(VERSION 2.15.0 REQUIRED)
#   find_package(loom 0.1 REQUIRED)                          # finds the same Torch
#
# loom_torch_wheel([VERSION <x.y.z>] [REQUIRED] [PYTHON_VARIABLE <var>]
#                  [DEFAULT_CUDA_ARCH_LIST <arch>...])
#   Runs find_package(Torch CONFIG) in the caller's scope, so Torch_FOUND, TORCH_INSTALL_PREFIX,
#   TORCH_LIBRARIES and the imported target `torch` come out as find_package makes them. Looks
#     1. where find_package looks by itself: an explicit Torch_DIR or CMAKE_PREFIX_PATH wins;
#     2. then in the first of these virtual environments whose python imports torch:
#        $ENV{LOOM_VENV}, $ENV{LOOM_HOME}/torch-<version>, $ENV{HOME}/.cache/loom/torch-<version>
#        (the last two only with VERSION), at its torch.utils.cmake_prefix_path.
#   Then it calls loom_torch_link_fix().
#   LibTorch's config compiles a CUDA program (its GPU probe, when TORCH_CUDA_ARCH_LIST is unset)
#   with CMAKE_CUDA_STANDARD, which it sets to CMAKE_CXX_STANDARD when empty; CMake 3.25 knows
#   no CUDA 20 for nvcc, so a project with set(CMAKE_CXX_STANDARD 20) would stop there
#   ("requires the language dialect CUDA20"). When CMAKE_CUDA_STANDARD is empty and
#   CMAKE_CXX_STANDARD is above 17, loom_torch_wheel sets CMAKE_CUDA_STANDARD to 17 for the
#   find_package call and puts it back afterwards.
#   VERSION       names the environments of step 2. It is no version requirement: a Torch given
#                 explicitly is used whatever its version.
#   REQUIRED      stop with an error when no Torch is found; without it Torch_FOUND is false.
#   PYTHON_VARIABLE <var>
#                 set the cache entry <var>, unless already set, to the python of the virtual
#                 environment that holds the Torch found (none for a LibTorch archive).
#   DEFAULT_CUDA_ARCH_LIST <arch>...
#                 set TORCH_CUDA_ARCH_LIST in the caller's scope unless the variable or the
#                 environment variable sets it already. Without it LibTorch's config compiles and
#                 runs a program to detect the GPU, and settles for a long default list on a build
#                 host without one.
#
# loom_torch_link_fix()
#   Lets executables link against the wheel's libtorch_cuda.so. That library finds its CUDA
#   libraries (NCCL, cuDNN, ...) through an $ORIGIN rpath into site-packages/nvidia/*/lib. GNU ld
#   does not expand $ORIGIN when it checks a shared library's own dependencies at link time, so it
#   picks the copies that ld.so.conf lists, such as an older NCCL from a CUDA toolkit, and fails
#   on symbols only the wheel's copies have (e.g. ncclSignal). This adds -rpath-link to
#   TORCH_INSTALL_PREFIX/lib and the wheel's nvidia/*/lib directories on the imported target
#   `torch`, so ld checks the libraries the loader will use at run time, for every target that
#   links `torch`. Call it after find_package(Torch); it does nothing without the target, off
#   Linux, or a second time.

include_guard(GLOBAL)

function(loom_torch_link_fix)
  if(NOT TARGET torch OR NOT TORCH_INSTALL_PREFIX OR NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
    return()
  endif()
  get_property(done TARGET torch PROPERTY LOOM_LINK_FIXED)
  if(done)
    return()
  endif()
  file(GLOB dirs LIST_DIRECTORIES true
       "${TORCH_INSTALL_PREFIX}/lib" "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
  if(dirs)
    list(JOIN dirs ":" joined)
    set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${joined}")
  endif()
  set_property(TARGET torch PROPERTY LOOM_LINK_FIXED TRUE)
endfunction()

# loom_torch_wheel is a macro only so that find_package(Torch) runs in the caller's scope and
# sets its variables there; the work is done in the functions below.
macro(loom_torch_wheel)
  _loom_torch_wheel_begin(${ARGN})
  _loom_torch_cuda_standard(PUSH)
  find_package(Torch QUIET CONFIG)
  if(NOT Torch_FOUND)
    _loom_torch_wheel_prefix(_loom_torch_wheel_prefix ${ARGN})
    if(_loom_torch_wheel_prefix)
      find_package(Torch CONFIG PATHS "${_loom_torch_wheel_prefix}" NO_DEFAULT_PATH)
    endif()
    unset(_loom_torch_wheel_prefix)
  endif()
  _loom_torch_cuda_standard(POP)
  _loom_torch_wheel_end(${ARGN})
endmacro()

# PUSH: when CMAKE_CUDA_STANDARD is empty and CMAKE_CXX_STANDARD is above 17, set the former
# to 17 in the caller's scope (LibTorch's CUDA probe then compiles with a standard every CMake
# knows for nvcc); POP: put it back as it was. The same logic is inline in loomConfig.cmake.
function(_loom_torch_cuda_standard what)
  if(what STREQUAL "PUSH")
    if("${CMAKE_CUDA_STANDARD}" STREQUAL "" AND CMAKE_CXX_STANDARD GREATER 17)
      if(DEFINED CMAKE_CUDA_STANDARD)
        set(_loom_torch_cuda_standard_was EMPTY PARENT_SCOPE)
      else()
        set(_loom_torch_cuda_standard_was UNDEFINED PARENT_SCOPE)
      endif()
      set(CMAKE_CUDA_STANDARD 17 PARENT_SCOPE)
    endif()
  elseif(_loom_torch_cuda_standard_was)
    if(_loom_torch_cuda_standard_was STREQUAL "EMPTY")
      set(CMAKE_CUDA_STANDARD "" PARENT_SCOPE)
    else()
      unset(CMAKE_CUDA_STANDARD PARENT_SCOPE)
    endif()
    unset(_loom_torch_cuda_standard_was PARENT_SCOPE)
  endif()
endfunction()

function(_loom_torch_wheel_begin)
  cmake_parse_arguments(PARSE_ARGV 0 arg REQUIRED "VERSION;PYTHON_VARIABLE"
                        DEFAULT_CUDA_ARCH_LIST)
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "loom_torch_wheel: unknown arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(arg_DEFAULT_CUDA_ARCH_LIST AND NOT DEFINED TORCH_CUDA_ARCH_LIST
     AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "${arg_DEFAULT_CUDA_ARCH_LIST}" PARENT_SCOPE)
  endif()
endfunction()

# Sets <out> to the CMake prefix of the first virtual environment with torch, or to "".
function(_loom_torch_wheel_prefix out)
  cmake_parse_arguments(PARSE_ARGV 1 arg REQUIRED "VERSION;PYTHON_VARIABLE"
                        DEFAULT_CUDA_ARCH_LIST)
  set(venvs)
  if(DEFINED ENV{LOOM_VENV})
    list(APPEND venvs "$ENV{LOOM_VENV}")
  endif()
  if(arg_VERSION)
    if(DEFINED ENV{LOOM_HOME})
      list(APPEND venvs "$ENV{LOOM_HOME}/torch-${arg_VERSION}")
    endif()
    if(DEFINED ENV{HOME})
      list(APPEND venvs "$ENV{HOME}/.cache/loom/torch-${arg_VERSION}")
    endif()
  endif()
  foreach(venv IN LISTS venvs)
    if(EXISTS "${venv}/bin/python")
      execute_process(
        COMMAND "${venv}/bin/python" -c
                "import sys, torch.utils; sys.stdout.write(torch.utils.cmake_prefix_path)"
        OUTPUT_VARIABLE prefix ERROR_QUIET RESULT_VARIABLE rc)
      if(rc EQUAL 0 AND IS_DIRECTORY "${prefix}")
        message(STATUS "loom: LibTorch from the torch wheel in ${venv}")
        set(${out} "${prefix}" PARENT_SCOPE)
        return()
      endif()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

function(_loom_torch_wheel_end)
  cmake_parse_arguments(PARSE_ARGV 0 arg REQUIRED "VERSION;PYTHON_VARIABLE"
                        DEFAULT_CUDA_ARCH_LIST)
  if(NOT Torch_FOUND)
    if(arg_REQUIRED)
      set(where "set LOOM_VENV to a virtual environment with the torch wheel")
      if(arg_VERSION)
        string(APPEND where ", or install torch==${arg_VERSION} into ~/.cache/loom/torch-"
               "${arg_VERSION} (loom's scripts/deps.sh does)")
      endif()
      message(FATAL_ERROR "loom_torch_wheel: LibTorch not found. Pass -DTorch_DIR=... or "
                          "-DCMAKE_PREFIX_PATH=..., or ${where}.")
    endif()
    return()
  endif()
  loom_torch_link_fix()
  if(arg_PYTHON_VARIABLE AND NOT ${arg_PYTHON_VARIABLE})
    # A wheel's TORCH_INSTALL_PREFIX is <venv>/lib/pythonX.Y/site-packages/torch.
    get_filename_component(venv "${TORCH_INSTALL_PREFIX}/../../../.." ABSOLUTE)
    if(EXISTS "${venv}/bin/python")
      set(${arg_PYTHON_VARIABLE} "${venv}/bin/python" CACHE FILEPATH "Python with the torch wheel")
    endif()
  endif()
endfunction()
