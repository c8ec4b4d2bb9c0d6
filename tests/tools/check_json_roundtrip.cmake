# `ridge-topo tree --json` must read back through --input: the matrix, tree and paths of the
# file must be those of the original (TOOL, PRESET, OUT_DIR).
set(json ${OUT_DIR}/${PRESET}.json)
execute_process(COMMAND ${TOOL} tree --preset ${PRESET} --json OUTPUT_FILE ${json} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "'ridge-topo tree --preset ${PRESET} --json' exited with ${rc}")
endif()
foreach(view matrix "matrix;--nccl" "paths;GPU0" "paths;GPU0;NIC0")
  execute_process(COMMAND ${TOOL} ${view} --preset ${PRESET} RESULT_VARIABLE rc1 OUTPUT_VARIABLE want
                  ERROR_VARIABLE err1)
  execute_process(COMMAND ${TOOL} ${view} --input ${json} RESULT_VARIABLE rc2 OUTPUT_VARIABLE got
                  ERROR_VARIABLE err2)
  if(NOT rc1 EQUAL 0 OR NOT rc2 EQUAL 0)
    message(FATAL_ERROR "'${view}' failed: preset ${rc1} (${err1}), file ${rc2} (${err2})")
  endif()
  if(NOT want STREQUAL got)
    message(FATAL_ERROR "'${view}' differs between --preset ${PRESET} and --input ${json}:\n${want}\n---\n${got}")
  endif()
endforeach()
# And the JSON written from the file is the JSON of the preset, but for where it came from.
execute_process(COMMAND ${TOOL} tree --input ${json} --json OUTPUT_VARIABLE again RESULT_VARIABLE rc)
file(READ ${json} first)
string(REGEX REPLACE "\"source\": \"[^\"]*\"" "" first "${first}")
string(REGEX REPLACE "\"source\": \"[^\"]*\"" "" again "${again}")
if(NOT rc EQUAL 0 OR NOT first STREQUAL again)
  message(FATAL_ERROR "tree --json of ${json} (rc ${rc}) differs from the file:\n${again}")
endif()
message(STATUS "${PRESET}: JSON reads back with the same matrix, paths and JSON")
