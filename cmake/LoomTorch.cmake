# Finding LibTorch for loom and for projects that use loom.
#
# loom_find_torch(<version>):
#   1. an explicit Torch_DIR or CMAKE_PREFIX_PATH wins (plain find_package);
#   2. otherwise the torch wheel in loom's virtual environment, as scripts/deps.sh installs it:
#      $ENV{LOOM_VENV}, else $ENV{LOOM_HOME}/torch-<version>, else ~/.cache/loom/torch-<version>.
# Then it lets executables link against the wheel's libtorch_cuda (see loom_torch_link_fix).

# The PyPI wheel's libtorch_cuda.so finds its CUDA libraries (NCCL, cuDNN, ...) through an
# $ORIGIN rpath into site-packages/nvidia/*/lib. GNU ld does not expand $ORIGIN when it checks
# a shared library's own dependencies at link time, so it picks the CUDA toolkit's older copies
# from ld.so.conf (NCCL 2.28 in CUDA 13.0) and fails on symbols only the wheel's copies have
# (e.g. ncclSignal). Pointing -rpath-link at the wheel's directories makes ld check the same
# libraries the loader will use at run time. The imported `torch` target carries the option,
# so every target that links it, loom's and its users', gets it.
function(loom_torch_link_fix)
  if(NOT TARGET torch OR NOT DEFINED TORCH_INSTALL_PREFIX)
    return()
  endif()
  get_property(done TARGET torch PROPERTY LOOM_LINK_FIXED)
  if(done)
    return()
  endif()
  file(GLOB nvidia_dirs LIST_DIRECTORIES true "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
  set(dirs "${TORCH_INSTALL_PREFIX}/lib" ${nvidia_dirs})
  list(JOIN dirs ":" joined)
  set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${joined}")
  set_property(TARGET torch PROPERTY LOOM_LINK_FIXED TRUE)
endfunction()

macro(loom_find_torch version)
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    # No GPU to detect on a build host; H100/H200 by default (only loom's own .cu files use it).
    set(TORCH_CUDA_ARCH_LIST "9.0")
  endif()
  find_package(Torch QUIET CONFIG)
  if(NOT Torch_FOUND)
    set(_loom_candidates)
    if(DEFINED ENV{LOOM_VENV})
      list(APPEND _loom_candidates "$ENV{LOOM_VENV}")
    endif()
    if(DEFINED ENV{LOOM_HOME})
      list(APPEND _loom_candidates "$ENV{LOOM_HOME}/torch-${version}")
    endif()
    list(APPEND _loom_candidates "$ENV{HOME}/.cache/loom/torch-${version}")
    foreach(_loom_venv IN LISTS _loom_candidates)
      if(EXISTS "${_loom_venv}/bin/python")
        execute_process(
          COMMAND "${_loom_venv}/bin/python" -c
                  "import sys, torch.utils; sys.stdout.write(torch.utils.cmake_prefix_path)"
          OUTPUT_VARIABLE _loom_torch_prefix ERROR_QUIET RESULT_VARIABLE _loom_rc)
        if(_loom_rc EQUAL 0 AND EXISTS "${_loom_torch_prefix}")
          message(STATUS "loom: using LibTorch from ${_loom_venv}")
          find_package(Torch CONFIG PATHS "${_loom_torch_prefix}" NO_DEFAULT_PATH)
          break()
        endif()
      endif()
    endforeach()
  endif()
  if(NOT Torch_FOUND)
    message(FATAL_ERROR
      "loom: LibTorch not found. Run scripts/deps.sh (it installs torch==${version} into "
      "~/.cache/loom), or pass -DTorch_DIR=... / -DCMAKE_PREFIX_PATH=... yourself.")
  endif()
  loom_torch_link_fix()
  # The Python interpreter of the torch wheel (parity tests and benchmarks run it).
  if(NOT LOOM_PYTHON)
    get_filename_component(_loom_site "${TORCH_INSTALL_PREFIX}/../../../.." ABSOLUTE)
    if(EXISTS "${_loom_site}/bin/python")
      set(LOOM_PYTHON "${_loom_site}/bin/python" CACHE FILEPATH "Python with the torch wheel")
    endif()
  endif()
endmacro()
