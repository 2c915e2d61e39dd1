# strata_cc_library(NAME name SRCS ... [HDRS ...] [DEPS ...])
#   Builds library strata_<name> with alias strata::<name>. Headers are
#   included as "folder/file.h" from the source root.
function(strata_cc_library)
  cmake_parse_arguments(A "" "NAME" "SRCS;HDRS;DEPS" ${ARGN})
  set(target strata_${A_NAME})
  if(A_SRCS)
    add_library(${target} STATIC ${A_SRCS} ${A_HDRS})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${target} PUBLIC ${A_DEPS})
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${target} INTERFACE ${A_DEPS})
  endif()
  add_library(strata::${A_NAME} ALIAS ${target})
endfunction()

# strata_cc_test(NAME name SRCS ... [DEPS ...] [LABELS ...] [TIMEOUT s]
#                [DEVICE [HOST_SUITES]])
#   A GoogleTest binary registered with CTest as one test (so a whole binary
#   is one CTest entry and its cases run in one process).
#   DEVICE: its suites need a CUDA device, except those named *HostTest. The
#   binary gets kernels/cuda/gpu_test_main.cc as its main and two entries:
#   `name` runs the device suites and is reported Skipped (exit code 77)
#   where there is no device; `name_host` (with HOST_SUITES, which says the
#   binary has such suites) runs the *HostTest suites, on every machine.
#   Either entry fails when its filter selects no test.
function(strata_cc_test)
  cmake_parse_arguments(A "DEVICE;HOST_SUITES" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  # Developer convenience while several people add files to one tree; off by
  # default, so a missing test source fails the configure step.
  if(STRATA_DEV_SKIP_MISSING_TESTS)
    foreach(src ${A_SRCS})
      if(NOT EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${src})
        message(WARNING "skipping test ${A_NAME}: ${src} does not exist yet")
        return()
      endif()
    endforeach()
  endif()
  if(A_HOST_SUITES AND NOT A_DEVICE)
    message(FATAL_ERROR "strata_cc_test(${A_NAME}): HOST_SUITES needs DEVICE")
  endif()
  add_executable(${A_NAME} ${A_SRCS})
  if(A_DEVICE)
    set(test_main strata::gpu_test_main)
  else()
    set(test_main GTest::gtest_main)
  endif()
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} GTest::gtest GTest::gmock ${test_main})
  target_include_directories(${A_NAME} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_compile_definitions(${A_NAME} PRIVATE
    STRATA_SOURCE_DIR="${PROJECT_SOURCE_DIR}" STRATA_BINARY_DIR="${PROJECT_BINARY_DIR}")
  set(timeout 600)
  if(A_TIMEOUT)
    set(timeout ${A_TIMEOUT})
  endif()
  if(A_DEVICE)
    # 77: kSkipExitCode in kernels/cuda/gpu_test_main.cc.
    add_test(NAME ${A_NAME} COMMAND ${A_NAME} --gtest_filter=-*HostTest.*)
    set_tests_properties(${A_NAME} PROPERTIES SKIP_RETURN_CODE 77)
    if(A_HOST_SUITES)
      add_test(NAME ${A_NAME}_host COMMAND ${A_NAME} --gtest_filter=*HostTest.*)
      set_tests_properties(${A_NAME}_host PROPERTIES TIMEOUT ${timeout})
    endif()
  else()
    add_test(NAME ${A_NAME} COMMAND ${A_NAME})
  endif()
  set_tests_properties(${A_NAME} PROPERTIES TIMEOUT ${timeout})
  if(A_LABELS)
    set_tests_properties(${A_NAME} PROPERTIES LABELS "${A_LABELS}")
  endif()
endfunction()
