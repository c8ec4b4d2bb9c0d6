# Tool-only code (renderers, doctor, capture, the NCCL XML export, the text summaries) lives in
# the static library ridge_tooling that ridge-topo and the tests link, not in libridge.so.
# Reads every symbol of libridge.so (LIB, the .symtab of an unstripped build, so also the
# hidden ones) with nm and fails if one of those entry points is in it. Two controls keep the
# check from passing for the wrong reason: the same names must be found in ridge_tooling
# (TOOLING, so the patterns match real symbols), and a symbol the library keeps must be found
# in libridge.so (so its symbols are readable at all, not stripped). And no Ridge symbol may be
# undefined in libridge.so (runtime code that still calls a function moved to ridge_tooling).
# Arguments: -DNM=path (empty or missing: skip), -DLIB=libridge.so, -DTOOLING=libridge_tooling.a
if(NOT NM OR NOT EXISTS "${NM}")
  message("SKIP: nm not found, cannot list the symbols of libridge")
  return()
endif()

# Demangled names; a function returning std::string carries an [abi:cxx11] tag.
set(_tool_only
    ridge::topo::renderTree
    ridge::topo::renderMatrix
    ridge::topo::renderPath
    ridge::topo::renderDot
    ridge::topo::matrixJson
    ridge::topo::runDoctor
    ridge::topo::doctorText
    ridge::topo::captureMachine
    ridge::topo::topologyToNcclXml
    ridge::formatSummary
    ridge::summarizeTopology
    ridge::summarizeHwlocXml
    ridge::plan::planText
    ridge::plan::planDot)
# Kept in libridge: RIDGE_SOFTNIC_PCIE_MODEL names a preset at run time.
set(_kept ridge::topo::loadPreset)

# Whether the nm listing `text` defines function `name`.
function(defines text name out)
  string(REGEX MATCH " ${name}(\\[abi:cxx11\\])?\\(" hit "${text}")
  if(hit)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

function(list_symbols file out)
  execute_process(COMMAND ${NM} -C --defined-only ${file} RESULT_VARIABLE rc OUTPUT_VARIABLE text
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} -C --defined-only ${file} failed (${rc}): ${err}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

list_symbols("${LIB}" _lib)
list_symbols("${TOOLING}" _tooling)

defines("${_lib}" ${_kept} _has)
if(NOT _has)
  message(FATAL_ERROR "${LIB}: ${_kept} not found: the library's symbols are not readable "
                      "(stripped?), so this check would prove nothing")
endif()
set(_found "")
foreach(sym IN LISTS _tool_only)
  defines("${_tooling}" ${sym} _has)
  if(NOT _has)
    message(FATAL_ERROR "${TOOLING} does not define ${sym}: the check's list is out of date")
  endif()
  defines("${_lib}" ${sym} _has)
  if(_has)
    list(APPEND _found "${sym}")
  endif()
endforeach()
if(_found)
  string(REPLACE ";" "\n  " _shown "${_found}")
  message(FATAL_ERROR "libridge.so contains tool-only code (it belongs in ridge_tooling):\n  ${_shown}")
endif()
# A shared library links with undefined symbols: code left in libridge that calls into
# ridge_tooling would only fail when a program loads it. None of Ridge's own may be undefined.
execute_process(COMMAND ${NM} -C -u ${LIB} RESULT_VARIABLE rc OUTPUT_VARIABLE _undefined)
string(REGEX MATCHALL "[^\n]*ridge::[^\n]*" _missing "${_undefined}")
if(_missing)
  string(REPLACE ";" "\n" _shown "${_missing}")
  message(FATAL_ERROR "libridge.so calls Ridge code it does not contain (moved to ridge_tooling?):\n${_shown}")
endif()
message("libridge has no tool-only code")
