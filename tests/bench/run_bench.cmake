# Runs ridge-bench once and checks what it did. Variables (-D):
#   BENCH       path of ridge-bench
#   ARGS        its arguments, separated by spaces
#   EXPECT      "pass" (exit status 0, the default) or "fail" (any non-zero status)
#   OUT_MATCH   regular expression stdout must match (optional)
#   OUT_MATCH2  a second one (optional)
#   ERR_MATCH   regular expression stderr must match (optional)
#   ERR_NOT     regular expression stderr must not match (optional)
#   JSON_FILE   a file the run writes that must parse as JSON with a non-empty "rows" list
#   JSON_STDOUT 1: stdout itself must be that JSON
#   JSON_CHECK  a Python expression over the parsed JSON `d` that must be true (optional)
#   PYTHON      interpreter for the JSON checks
#   PICTURE     a file the run must write: an SVG (starts with <?xml or <svg) or a PNG
#   TIMEOUT     seconds (default 50)
#   SKIP_ERR    regular expression: a non-zero exit whose stderr matches it prints
#               "skipped: <SKIP_MSG>" (ctest's SKIP_REGULAR_EXPRESSION) instead of
#               failing; for runs that need what a machine may lack (a GPU, a plotter)
#   SKIP_MSG    what is missing (default "no CUDA device")
if(NOT DEFINED TIMEOUT)
  set(TIMEOUT 50)
endif()
if(NOT DEFINED EXPECT)
  set(EXPECT pass)
endif()
separate_arguments(_args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND "${BENCH}" ${_args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${TIMEOUT})
string(REPLACE ";" " " _shown "${_args}")
message("$ ridge-bench ${_shown}\n--- stdout ---\n${out}--- stderr ---\n${err}--- exit: ${rc}")

if(NOT DEFINED SKIP_MSG)
  set(SKIP_MSG "no CUDA device")
endif()
if(DEFINED SKIP_ERR AND NOT rc EQUAL 0 AND err MATCHES "${SKIP_ERR}")
  message("skipped: ${SKIP_MSG}")
  return()
endif()

if(EXPECT STREQUAL "fail")
  if(rc EQUAL 0)
    message(FATAL_ERROR "expected a non-zero exit status, got 0")
  endif()
  if(NOT rc MATCHES "^[0-9]+$")
    message(FATAL_ERROR "expected a clean non-zero exit, got '${rc}'")
  endif()
elseif(NOT rc EQUAL 0)
  message(FATAL_ERROR "expected exit status 0, got '${rc}'")
endif()

foreach(_v OUT_MATCH OUT_MATCH2)
  if(DEFINED ${_v} AND NOT out MATCHES "${${_v}}")
    message(FATAL_ERROR "stdout does not match '${${_v}}'")
  endif()
endforeach()
if(DEFINED ERR_MATCH AND NOT err MATCHES "${ERR_MATCH}")
  message(FATAL_ERROR "stderr does not match '${ERR_MATCH}'")
endif()
if(DEFINED ERR_NOT AND err MATCHES "${ERR_NOT}")
  message(FATAL_ERROR "stderr matches '${ERR_NOT}', which it must not")
endif()
if(DEFINED PICTURE)
  if(NOT EXISTS "${PICTURE}")
    message(FATAL_ERROR "no picture at ${PICTURE}")
  endif()
  file(READ "${PICTURE}" _head LIMIT 64 HEX)
  # PNG signature 89 50 4E 47; SVG text "<?xml" (3c3f786d6c) or "<svg" (3c737667).
  if(NOT _head MATCHES "^89504e47" AND NOT _head MATCHES "^3c3f786d6c" AND NOT _head MATCHES "^3c737667")
    message(FATAL_ERROR "${PICTURE} is neither PNG nor SVG (starts ${_head})")
  endif()
  file(SIZE "${PICTURE}" _size)
  message("picture ok: ${PICTURE}, ${_size} bytes")
  file(REMOVE "${PICTURE}")
endif()

set(_check [=[
import json, sys
with open(sys.argv[1]) as f:
    d = json.load(f)
rows = d["rows"]
assert rows, "no rows"
for r in rows:
    for k in ("size", "count", "time_us", "algbw", "busbw", "wrong"):
        assert k in r, "missing " + k
    assert r["wrong"] in (0, None), "wrong results in %r" % r
check = sys.argv[2] if len(sys.argv) > 2 else ""
if check:
    assert eval(check, {"d": d}), "JSON_CHECK failed: " + check
print("json ok: %d rows" % len(rows))
]=])
if(JSON_STDOUT)
  get_filename_component(_dir "${BENCH}" DIRECTORY)
  string(RANDOM LENGTH 8 _tag)
  set(JSON_FILE "${_dir}/ridge-bench-stdout-${_tag}.json")
  file(WRITE "${JSON_FILE}" "${out}")
endif()
if(DEFINED JSON_FILE)
  execute_process(COMMAND "${PYTHON}" -c "${_check}" "${JSON_FILE}" "${JSON_CHECK}"
                  RESULT_VARIABLE prc OUTPUT_VARIABLE pout ERROR_VARIABLE perr)
  message("${pout}${perr}")
  if(JSON_STDOUT)
    file(REMOVE "${JSON_FILE}")
  endif()
  if(NOT prc EQUAL 0)
    message(FATAL_ERROR "the JSON output does not parse or lacks rows")
  endif()
endif()
