# Configures Ridge as a new user would (`cmake -S . -B build`, default generator, whatever
# compilers PATH offers) in a scratch directory, and fails on any configure or generate error.
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=CMAKE_GENERATOR
                        ${CMAKE_COMMAND} -S ${SRC} -B ${WORK} -G "Unix Makefiles" -DRIDGE_BUILD_TESTS=OFF
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE ${WORK})
if(NOT rc EQUAL 0 OR err MATCHES "CMake Error")
  message(FATAL_ERROR "plain cmake configure failed (${rc}):\n${out}\n${err}")
endif()
string(REGEX MATCH "Ridge: CUDA=[A-Z]+" parts "${out}")
message(STATUS "plain configure OK (${parts})")
