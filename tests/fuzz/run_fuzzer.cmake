# Runs one libFuzzer target for a bounded time, as a ctest: the seed corpus is copied to
# a scratch directory first (libFuzzer adds the inputs it finds to its corpus directory,
# and the seeds stay as generated), which is removed afterwards. A crash, leak, timeout or
# broken invariant makes libFuzzer exit non-zero, and this script fail; the input is kept
# as ARTIFACTS/<target>-crash-<sha1> (or leak-, timeout-, oom-) for replay with
# `<target> <file>`.
#
# cmake -DFUZZER=<binary> -DSEEDS=<dir> -DARTIFACTS=<dir> -DSECONDS=<n> [-DDICT=<file>]
#       -P run_fuzzer.cmake
# DICT: a libFuzzer dictionary (tokens the target's input format is made of).
foreach(var FUZZER SEEDS ARTIFACTS SECONDS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzzer.cmake: -D${var}=... is required")
  endif()
endforeach()

get_filename_component(name "${FUZZER}" NAME)
if(DEFINED ENV{TMPDIR} AND IS_DIRECTORY "$ENV{TMPDIR}")
  set(tmp_root "$ENV{TMPDIR}")
else()
  set(tmp_root "/tmp")
endif()
string(RANDOM LENGTH 12 suffix)
set(corpus "${tmp_root}/ina-${name}-${suffix}")
file(MAKE_DIRECTORY "${corpus}" "${ARTIFACTS}")
file(GLOB seeds "${SEEDS}/*")
if(seeds)
  file(COPY ${seeds} DESTINATION "${corpus}")
endif()

set(dict_option)
if(DEFINED DICT AND NOT DICT STREQUAL "")
  set(dict_option "-dict=${DICT}")
endif()

# -timeout: one input taking 10 s would stall a server thread; report it.
execute_process(
  COMMAND "${FUZZER}" -max_total_time=${SECONDS} -rss_limit_mb=2048 -timeout=10
          -print_final_stats=1 ${dict_option} "-artifact_prefix=${ARTIFACTS}/${name}-" "${corpus}"
  RESULT_VARIABLE rc)
file(REMOVE_RECURSE "${corpus}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${name}: libFuzzer exited with ${rc}; the input is under ${ARTIFACTS}")
endif()
