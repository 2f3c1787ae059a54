# ctest helper: fails when README.md no longer shows examples/basic.c verbatim.
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "${example}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not contain examples/basic.c verbatim: update the README's C example")
endif()
