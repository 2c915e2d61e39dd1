# Decides whether the CUDA parts are built (STRATA_HAVE_CUDA) and says why.
#
# STRATA_CUDA=AUTO builds them whenever the CUDA toolkit is installed: an nvcc
# named by CMAKE_CUDA_COMPILER or CUDACXX, else the one on the PATH, else the
# toolkit's standard location /usr/local/cuda/bin/nvcc (a CI shell may not
# have /usr/local/cuda/bin on its PATH). ON fails the configure step when none
# is usable; OFF never looks. The configure output names the nvcc and where it
# was found, or why the kernels are off.
set(STRATA_HAVE_CUDA OFF)
set(strata_cuda_standard_nvcc /usr/local/cuda/bin/nvcc)

if(STRATA_CUDA STREQUAL "OFF")
  set(strata_cuda_why "STRATA_CUDA=OFF")
else()
  # A NOTFOUND left in the cache by an earlier configure would stop
  # check_language from looking again after the toolkit was installed.
  if(DEFINED CMAKE_CUDA_COMPILER AND NOT CMAKE_CUDA_COMPILER)
    unset(CMAKE_CUDA_COMPILER CACHE)
  endif()
  set(strata_nvcc "")
  if(DEFINED CMAKE_CUDA_COMPILER)
    # Named on the command line, or found by an earlier configure of this
    # build folder (which recorded where).
    set(strata_nvcc_where "CMAKE_CUDA_COMPILER")
    if(STRATA_CUDA_FOUND_AT STREQUAL CMAKE_CUDA_COMPILER)
      set(strata_nvcc_where "${STRATA_CUDA_FOUND_HOW}")
    endif()
  elseif(NOT "$ENV{CUDACXX}" STREQUAL "")
    set(strata_nvcc "$ENV{CUDACXX}")
    set(strata_nvcc_where "CUDACXX")
  else()
    find_program(strata_nvcc_on_path NAMES nvcc NO_CACHE NO_DEFAULT_PATH PATHS ENV PATH)
    if(strata_nvcc_on_path)
      set(strata_nvcc "${strata_nvcc_on_path}")
      set(strata_nvcc_where "on the PATH")
    elseif(EXISTS ${strata_cuda_standard_nvcc})
      set(strata_nvcc ${strata_cuda_standard_nvcc})
      set(strata_nvcc_where "the toolkit's standard location, not on the PATH")
    endif()
  endif()

  if(NOT DEFINED CMAKE_CUDA_COMPILER AND strata_nvcc STREQUAL "")
    set(strata_cuda_why "no nvcc on PATH or at /usr/local/cuda")
  else()
    # check_language builds a test project in a child CMake, which finds the
    # compiler through CUDACXX.
    if(NOT strata_nvcc STREQUAL "")
      set(ENV{CUDACXX} "${strata_nvcc}")
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_ARCHITECTURES 90a)
      enable_language(CUDA)
      set(CMAKE_CUDA_STANDARD 17)  # nvcc 13 with CMake 3.25 has no CUDA20 dialect
      find_package(CUDAToolkit REQUIRED)
      set(STRATA_HAVE_CUDA ON)
      string(REGEX MATCH "^[0-9]+\\.[0-9]+" strata_nvcc_version "${CMAKE_CUDA_COMPILER_VERSION}")
      set(strata_cuda_why "nvcc ${strata_nvcc_version} at ${CMAKE_CUDA_COMPILER} (${strata_nvcc_where})")
      set(STRATA_CUDA_FOUND_AT "${CMAKE_CUDA_COMPILER}" CACHE INTERNAL "the nvcc this folder was configured with")
      set(STRATA_CUDA_FOUND_HOW "${strata_nvcc_where}" CACHE INTERNAL "where that nvcc was found")
    else()
      set(strata_cuda_why
          "nvcc at ${strata_nvcc} (${strata_nvcc_where}) cannot build a test program (see CMakeFiles/CheckCUDA)")
    endif()
  endif()
  if(NOT STRATA_HAVE_CUDA AND STRATA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRATA_CUDA=ON but the CUDA kernels cannot be built: ${strata_cuda_why}")
  endif()
endif()

if(STRATA_HAVE_CUDA)
  message(STATUS "Strata: CUDA kernels ON: ${strata_cuda_why}")
else()
  message(STATUS "Strata: CUDA kernels OFF: ${strata_cuda_why}")
endif()
