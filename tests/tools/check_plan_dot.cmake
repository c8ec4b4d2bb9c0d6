# The plan picture of 16 ranks x 8 channels (written by ridge_topo.plan_dot_file): one
# cluster per channel, each rank once per channel, and only the network hops labelled with
# their NIC, so that the picture stays legible; then Graphviz must lay it out (when present).
file(READ ${FILE} dot)
string(REGEX MATCHALL "subgraph cluster_c[0-9]+" clusters "${dot}")
list(LENGTH clusters nclusters)
string(REGEX MATCHALL "fillcolor=" boxes "${dot}")
list(LENGTH boxes nboxes)
string(REGEX MATCHALL "label=\"NIC[0-9]+" netLabels "${dot}")
list(LENGTH netLabels nnet)
if(NOT nclusters EQUAL 8 OR NOT nboxes EQUAL 128 OR NOT nnet EQUAL 16)
  message(FATAL_ERROR "plan picture: ${nclusters} channel rows (want 8), ${nboxes} rank boxes (want 128), "
                      "${nnet} network labels (want 16: two per ring)\n${dot}")
endif()
find_program(DOT dot)
if(DOT)
  execute_process(COMMAND ${DOT} -Tsvg ${FILE} -o ${FILE}.svg RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "dot failed on the plan picture: ${err}")
  endif()
endif()
message(STATUS "plan picture OK")
