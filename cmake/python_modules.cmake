# tdt_python_missing(OUT MODULE:DEBIAN_PACKAGE ...): in OUT, "MODULE (Debian: PACKAGE)" for each
# module that /usr/bin/python3 cannot import (empty when all import); the tests that run Python
# say with it what to install.
function(tdt_python_missing out)
  set(_missing "")
  foreach(_mod_pkg IN LISTS ARGN)
    string(REPLACE ":" ";" _mod_pkg "${_mod_pkg}")
    list(GET _mod_pkg 0 _mod)
    list(GET _mod_pkg 1 _pkg)
    execute_process(COMMAND /usr/bin/python3 -c "import ${_mod}"
                    RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
    if(NOT _rc EQUAL 0)
      list(APPEND _missing "${_mod} (Debian: ${_pkg})")
    endif()
  endforeach()
  set(${out} "${_missing}" PARENT_SCOPE)
endfunction()
