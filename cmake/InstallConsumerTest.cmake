# The install_consumer test: install this build into a fresh prefix, then
# configure, build and run examples/cpp against it with find_package, as a
# user's project would. Run by CTest as
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX=... -P InstallConsumerTest.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: ${what} failed (${rc}):\n${err}")
  endif()
endfunction()
step("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
step("configure examples/cpp" ${CMAKE_COMMAND} -S "${SOURCE_DIR}/examples/cpp" -B "${WORK_DIR}/build"
     -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release
     -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
step("build examples/cpp" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
step("run quickstart" "${WORK_DIR}/build/quickstart")
