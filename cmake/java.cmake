# The Java binding (issue 21, bindings/java/README.md): SWIG generates the JNI wrapper and the
# package org.fp8amp.swig from the public header (bindings/swig/fp8amp.i, the language-neutral part,
# and bindings/java/fp8amp_java.i); the hand-written classes of org.fp8amp sit on top. Builds
# libfp8amp_java.so and fp8amp.jar, and with FP8AMP_BUILD_TESTS the tests java.junit and
# conformance.java. Maven cannot fetch plugins offline here, so javac and jar run directly
# (bindings/java/build_jar.cmake), with JUnit 5's console launcher from Debian's junit5 package.
option(FP8AMP_BINDINGS_JAVA "Build the Java binding (SWIG + JNI): libfp8amp_java.so and fp8amp.jar" OFF)
if(NOT FP8AMP_BINDINGS_JAVA)
  return()
endif()

find_package(SWIG 4.0)
find_package(Java 17 COMPONENTS Development)
# JNI headers: those of the JDK whose javac was found (FindJNI misses a JDK outside its list of
# places, e.g. Debian's without default-java, and insists on AWT and libjvm, which JNI code does not
# need); FindJNI when that JDK has none.
set(FP8AMP_JNI_INCLUDE_DIRS)
if(Java_JAVAC_EXECUTABLE)
  file(REAL_PATH ${Java_JAVAC_EXECUTABLE} fp8amp_javac)
  get_filename_component(fp8amp_jdk ${fp8amp_javac} DIRECTORY)
  get_filename_component(fp8amp_jdk ${fp8amp_jdk} DIRECTORY)
  if(EXISTS ${fp8amp_jdk}/include/jni.h AND EXISTS ${fp8amp_jdk}/include/linux/jni_md.h)
    set(FP8AMP_JNI_INCLUDE_DIRS ${fp8amp_jdk}/include ${fp8amp_jdk}/include/linux)
  endif()
endif()
if(NOT FP8AMP_JNI_INCLUDE_DIRS)
  find_package(JNI)
  if(JAVA_INCLUDE_PATH AND JAVA_INCLUDE_PATH2)
    set(FP8AMP_JNI_INCLUDE_DIRS ${JAVA_INCLUDE_PATH} ${JAVA_INCLUDE_PATH2})
  endif()
endif()
if(NOT SWIG_FOUND OR NOT Java_FOUND OR NOT FP8AMP_JNI_INCLUDE_DIRS)
  message(FATAL_ERROR "FP8AMP_BINDINGS_JAVA=ON needs SWIG >= 4.0 (found: ${SWIG_FOUND}), a JDK >= 17 "
                      "(found: ${Java_FOUND}) and its JNI headers (found: ${FP8AMP_JNI_INCLUDE_DIRS}). "
                      "Debian/Ubuntu: apt-get install swig openjdk-17-jdk-headless junit5 "
                      "(or: . tests/install_deps.sh java)")
endif()

set(FP8AMP_JAVA_DIR ${PROJECT_SOURCE_DIR}/bindings/java)
set(FP8AMP_JAVA_BUILD ${PROJECT_BINARY_DIR}/java)
set(FP8AMP_JAVA_GEN ${FP8AMP_JAVA_BUILD}/generated)

# ---- SWIG: the JNI wrapper (C) and org.fp8amp.swig (Java) ------------------------------------------
# SWIGWORDSIZE64: SWIG's stdint.i then spells int64_t as long, as LP64 glibc does (else a warning
# for every shape pointer).
set(FP8AMP_SWIG_WORDSIZE)
if(CMAKE_SIZEOF_VOID_P EQUAL 8 AND NOT WIN32)
  set(FP8AMP_SWIG_WORDSIZE -DSWIGWORDSIZE64)
endif()
add_custom_command(
  OUTPUT ${FP8AMP_JAVA_GEN}/fp8amp_java_wrap.c
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${FP8AMP_JAVA_GEN}/src
  COMMAND ${CMAKE_COMMAND} -E make_directory ${FP8AMP_JAVA_GEN}/src/org/fp8amp/swig
  COMMAND ${SWIG_EXECUTABLE} -java ${FP8AMP_SWIG_WORDSIZE} -Werror -package org.fp8amp.swig
          -outdir ${FP8AMP_JAVA_GEN}/src/org/fp8amp/swig -o ${FP8AMP_JAVA_GEN}/fp8amp_java_wrap.c
          -I${PROJECT_SOURCE_DIR}/capi/include
          ${FP8AMP_JAVA_DIR}/fp8amp_java.i
  DEPENDS ${FP8AMP_JAVA_DIR}/fp8amp_java.i ${PROJECT_SOURCE_DIR}/bindings/swig/fp8amp.i
          ${PROJECT_SOURCE_DIR}/capi/include/fp8amp/fp8amp.h ${PROJECT_SOURCE_DIR}/capi/include/fp8amp/version.h
  COMMENT "SWIG: the Java binding's JNI wrapper and org.fp8amp.swig"
  VERBATIM)

add_library(fp8amp_java SHARED ${FP8AMP_JAVA_GEN}/fp8amp_java_wrap.c)
target_include_directories(fp8amp_java PRIVATE ${FP8AMP_JNI_INCLUDE_DIRS})
target_link_libraries(fp8amp_java PRIVATE fp8amp)
# SWIG's advice for its JNI code; the JNI entry points carry JNIEXPORT (default visibility) themselves.
target_compile_options(fp8amp_java PRIVATE -fno-strict-aliasing)
set_target_properties(fp8amp_java PROPERTIES
  C_VISIBILITY_PRESET hidden
  LIBRARY_OUTPUT_DIRECTORY ${FP8AMP_JAVA_BUILD}
  INSTALL_RPATH "$ORIGIN")

# ---- the jars -----------------------------------------------------------------------------------------
file(GLOB_RECURSE FP8AMP_JAVA_MAIN_SOURCES CONFIGURE_DEPENDS ${FP8AMP_JAVA_DIR}/src/main/java/*.java)
add_custom_command(
  OUTPUT ${FP8AMP_JAVA_BUILD}/fp8amp.jar
  COMMAND ${CMAKE_COMMAND} -DJAVAC=${Java_JAVAC_EXECUTABLE} -DJAR=${Java_JAR_EXECUTABLE}
          -DOUT=${FP8AMP_JAVA_BUILD}/fp8amp.jar -DCLASSES=${FP8AMP_JAVA_BUILD}/classes/main
          "-DSOURCES=${FP8AMP_JAVA_GEN}/src;${FP8AMP_JAVA_DIR}/src/main/java" -DCLASSPATH=
          -P ${FP8AMP_JAVA_DIR}/build_jar.cmake
  DEPENDS ${FP8AMP_JAVA_GEN}/fp8amp_java_wrap.c ${FP8AMP_JAVA_MAIN_SOURCES} ${FP8AMP_JAVA_DIR}/build_jar.cmake
  COMMENT "javac + jar: fp8amp.jar"
  VERBATIM)
add_custom_target(fp8amp_jar ALL DEPENDS ${FP8AMP_JAVA_BUILD}/fp8amp.jar fp8amp_java)

install(TARGETS fp8amp_java LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${FP8AMP_JAVA_BUILD}/fp8amp.jar DESTINATION ${CMAKE_INSTALL_DATADIR}/java)

if(NOT FP8AMP_BUILD_TESTS)
  return()
endif()

# The conformance runner (tests/conformance/SCENARIO.md): needs fp8amp.jar only.
file(GLOB_RECURSE FP8AMP_JAVA_CONFORMANCE_SOURCES CONFIGURE_DEPENDS ${FP8AMP_JAVA_DIR}/src/conformance/java/*.java)
add_custom_command(
  OUTPUT ${FP8AMP_JAVA_BUILD}/fp8amp-conformance.jar
  COMMAND ${CMAKE_COMMAND} -DJAVAC=${Java_JAVAC_EXECUTABLE} -DJAR=${Java_JAR_EXECUTABLE}
          -DOUT=${FP8AMP_JAVA_BUILD}/fp8amp-conformance.jar -DCLASSES=${FP8AMP_JAVA_BUILD}/classes/conformance
          -DSOURCES=${FP8AMP_JAVA_DIR}/src/conformance/java -DCLASSPATH=${FP8AMP_JAVA_BUILD}/fp8amp.jar
          -P ${FP8AMP_JAVA_DIR}/build_jar.cmake
  DEPENDS ${FP8AMP_JAVA_BUILD}/fp8amp.jar ${FP8AMP_JAVA_CONFORMANCE_SOURCES} ${FP8AMP_JAVA_DIR}/build_jar.cmake
  COMMENT "javac + jar: fp8amp-conformance.jar"
  VERBATIM)
add_custom_target(fp8amp_java_conformance ALL DEPENDS ${FP8AMP_JAVA_BUILD}/fp8amp-conformance.jar)

set(FP8AMP_JAVA_RUN ${Java_JAVA_EXECUTABLE} -Xcheck:jni -Dfp8amp.jni.library=$<TARGET_FILE:fp8amp_java>)
# The runner writes beside the other bindings' files; conformance.compare (tests/conformance) requires
# java.bin when FP8AMP_BINDINGS_JAVA is on, and runs after this test (the fixture).
set(fp8amp_java_bin ${PROJECT_BINARY_DIR}/tests/conformance/out/java.bin)
file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/tests/conformance/out)
add_test(NAME conformance.java
         COMMAND sh -c "rm -f \"$1\" && shift && exec \"$@\"" sh ${fp8amp_java_bin} ${FP8AMP_JAVA_RUN}
                 -cp ${FP8AMP_JAVA_BUILD}/fp8amp.jar:${FP8AMP_JAVA_BUILD}/fp8amp-conformance.jar
                 org.fp8amp.conformance.Conformance ${fp8amp_java_bin})
set_tests_properties(conformance.java PROPERTIES FIXTURES_SETUP conformance)

# JUnit 5 through its console launcher (Debian: junit5, /usr/share/java).
find_file(FP8AMP_JUNIT_CONSOLE junit-platform-console-standalone.jar
          PATHS /usr/share/java ENV JUNIT_HOME NO_DEFAULT_PATH)
if(NOT FP8AMP_JUNIT_CONSOLE)
  message(FATAL_ERROR "FP8AMP_BINDINGS_JAVA=ON with FP8AMP_BUILD_TESTS needs JUnit 5's "
                      "junit-platform-console-standalone.jar (Debian: apt-get install junit5; "
                      "or set FP8AMP_JUNIT_CONSOLE to its path)")
endif()
# The README's example (examples/Example.java) is compiled with the tests, which check it and run it.
file(GLOB_RECURSE FP8AMP_JAVA_TEST_SOURCES CONFIGURE_DEPENDS ${FP8AMP_JAVA_DIR}/src/test/java/*.java
     ${FP8AMP_JAVA_DIR}/examples/*.java)
add_custom_command(
  OUTPUT ${FP8AMP_JAVA_BUILD}/fp8amp-tests.jar
  COMMAND ${CMAKE_COMMAND} -DJAVAC=${Java_JAVAC_EXECUTABLE} -DJAR=${Java_JAR_EXECUTABLE}
          -DOUT=${FP8AMP_JAVA_BUILD}/fp8amp-tests.jar -DCLASSES=${FP8AMP_JAVA_BUILD}/classes/test
          "-DSOURCES=${FP8AMP_JAVA_DIR}/src/test/java;${FP8AMP_JAVA_DIR}/examples"
          -DCLASSPATH=${FP8AMP_JAVA_BUILD}/fp8amp.jar:${FP8AMP_JUNIT_CONSOLE}
          -P ${FP8AMP_JAVA_DIR}/build_jar.cmake
  DEPENDS ${FP8AMP_JAVA_BUILD}/fp8amp.jar ${FP8AMP_JAVA_TEST_SOURCES} ${FP8AMP_JAVA_DIR}/build_jar.cmake
  COMMENT "javac + jar: fp8amp-tests.jar"
  VERBATIM)
add_custom_target(fp8amp_java_tests ALL DEPENDS ${FP8AMP_JAVA_BUILD}/fp8amp-tests.jar)
add_test(NAME java.junit
         COMMAND ${FP8AMP_JAVA_RUN} -Dfp8amp.java.readme=${FP8AMP_JAVA_DIR}/README.md
                 -Dfp8amp.java.example=${FP8AMP_JAVA_DIR}/examples/Example.java
                 -Dfp8amp.header=${PROJECT_SOURCE_DIR}/capi/include/fp8amp/fp8amp.h
                 -jar ${FP8AMP_JUNIT_CONSOLE} --disable-banner --details=tree
                 --fail-if-no-tests
                 --class-path ${FP8AMP_JAVA_BUILD}/fp8amp.jar:${FP8AMP_JAVA_BUILD}/fp8amp-tests.jar
                 --select-package org.fp8amp)
