# Runs CMD with the list ARGS and checks that it exits with EXPECT_RC and, when
# EXPECT_OUTPUT is set, that stdout+stderr match that regular expression.
execute_process(COMMAND ${CMD} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REPLACE ";" " " shown "${ARGS}")
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "'${CMD} ${shown}' exited with ${rc}, expected ${EXPECT_RC}\n"
                      "stdout:\n${out}\nstderr:\n${err}")
endif()
if(DEFINED EXPECT_OUTPUT AND NOT "${out}${err}" MATCHES "${EXPECT_OUTPUT}")
  message(FATAL_ERROR "output of '${CMD} ${shown}' does not match '${EXPECT_OUTPUT}'\n"
                      "stdout:\n${out}\nstderr:\n${err}")
endif()
message(STATUS "'${shown}' exited with ${rc} as expected\n${out}${err}")
