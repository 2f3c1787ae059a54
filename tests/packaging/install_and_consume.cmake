# install_and_consume.cmake - `cmake --install` of BUILD_DIR into a fresh prefix, which is then
# moved (an installed tree must not depend on where it was installed); then the consumer
# program is built against the moved tree through find_package(WarpTDT) and through pkg-config,
# and both are run.
# cmake -DBUILD_DIR=... -DWORK=... -DCONSUMER=... -DCC=... -DLIBDIR=... [-DPKG_CONFIG=...]
#       -P install_and_consume.cmake
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "`${cmd}` failed (${rc}):\n${out}${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK}/installed")
file(RENAME "${WORK}/installed" "${WORK}/moved")
set(prefix "${WORK}/moved")
foreach(f include/tdt.h ${LIBDIR}/libwarptdt.so ${LIBDIR}/cmake/WarpTDT/WarpTDTConfig.cmake
          ${LIBDIR}/pkgconfig/warptdt.pc)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "cmake --install did not write ${f}")
  endif()
endforeach()
file(READ "${prefix}/${LIBDIR}/pkgconfig/warptdt.pc" pc)
if(NOT pc MATCHES "prefix=\\\${pcfiledir}/")
  message(FATAL_ERROR "warptdt.pc's prefix is not relative to the file:\n${pc}")
endif()

# find_package(WarpTDT): the imported target gives the program an rpath to the library
run("${CMAKE_COMMAND}" -S "${CONSUMER}" -B "${WORK}/by-cmake" "-DCMAKE_PREFIX_PATH=${prefix}"
    -DCMAKE_C_COMPILER=${CC})
run("${CMAKE_COMMAND}" --build "${WORK}/by-cmake")
run("${WORK}/by-cmake/consumer")
message("find_package(WarpTDT): ${out}")

# pkg-config, with the rpath the README's plain compile line also gives
if(PKG_CONFIG)
  set(ENV{PKG_CONFIG_PATH} "${prefix}/${LIBDIR}/pkgconfig")
  run("${PKG_CONFIG}" --variable=libdir warptdt)
  string(STRIP "${out}" libdir)
  get_filename_component(libdir_real "${libdir}" REALPATH)
  get_filename_component(want_real "${prefix}/${LIBDIR}" REALPATH)
  if(NOT libdir_real STREQUAL want_real)
    message(FATAL_ERROR "pkg-config's libdir is ${libdir}, not the moved tree's ${prefix}/${LIBDIR}")
  endif()
  run("${PKG_CONFIG}" --cflags --libs warptdt)
  string(STRIP "${out}" flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run("${CC}" -std=c99 "${CONSUMER}/consumer.c" ${flags} "-Wl,-rpath,${libdir}" -lm
      -o "${WORK}/by-pkg-config")
  run("${WORK}/by-pkg-config")
  message("pkg-config: ${out}")
endif()
