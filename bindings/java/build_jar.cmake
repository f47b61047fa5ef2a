# Compiles every .java file under SOURCES (a list of folders) into CLASSES and packs them into OUT.
#   cmake -DJAVAC=... -DJAR=... -DOUT=x.jar -DCLASSES=dir "-DSOURCES=dir1;dir2" -DCLASSPATH=a.jar:b.jar -P build_jar.cmake
# A script rather than CMake's add_jar: SWIG's Java files are known only after SWIG has run.
file(REMOVE_RECURSE ${CLASSES})
file(MAKE_DIRECTORY ${CLASSES})
set(files)
foreach(dir IN LISTS SOURCES)
  file(GLOB_RECURSE found ${dir}/*.java)
  list(APPEND files ${found})
endforeach()
if(NOT files)
  message(FATAL_ERROR "build_jar.cmake: no .java file under ${SOURCES}")
endif()
list(SORT files)
set(args)
foreach(f IN LISTS files)
  string(APPEND args "\"${f}\"\n")
endforeach()
file(WRITE ${CLASSES}.sources ${args})
set(cp)
if(CLASSPATH)
  set(cp -cp ${CLASSPATH})
endif()
# --release 17: the jar runs on JDK 17, whichever newer javac compiled it. -Xlint shows every
# warning; SWIG's proxies use finalize() (deprecated), hence no -Werror.
execute_process(COMMAND ${JAVAC} --release 17 -encoding UTF-8 -Xlint:all,-removal,-deprecation
                        ${cp} -d ${CLASSES} @${CLASSES}.sources
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "javac failed (${rc})")
endif()
execute_process(COMMAND ${JAR} --create --file ${OUT} -C ${CLASSES} . RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "jar failed (${rc})")
endif()
