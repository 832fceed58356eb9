# One helper registers every test binary with CTest.
#   gatedmlp_add_test(NAME <name> SOURCES <files...> LABEL cpu|gpu [LIBS <targets...>])
# GPU tests call GTEST_SKIP() when no device is present; the skip regex makes
# CTest report them as skipped rather than passed.
find_package(GTest QUIET)
if(NOT GTest_FOUND)
  if(EXISTS /usr/src/googletest/CMakeLists.txt)
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    add_subdirectory(/usr/src/googletest ${CMAKE_BINARY_DIR}/_googletest EXCLUDE_FROM_ALL)
    add_library(GTest::gtest ALIAS gtest)
    add_library(GTest::gtest_main ALIAS gtest_main)
  else()
    message(FATAL_ERROR "GoogleTest not found: install libgtest-dev (see .ci/run)")
  endif()
endif()
include(GoogleTest)

function(gatedmlp_add_test)
  cmake_parse_arguments(T "" "NAME;LABEL" "SOURCES;LIBS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  gatedmlp_set_compile_options(${T_NAME})
  gtest_discover_tests(${T_NAME}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS ${T_LABEL} SKIP_REGULAR_EXPRESSION "  SKIPPED ")
endfunction()
