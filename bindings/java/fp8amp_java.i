/* fp8amp_java.i -- the Java-specific part of fp8amp's SWIG interface (issue 21).
 *
 * Generates package org.fp8amp.swig: the class Fp8amp (one static method per C function of the
 * header, C names without the "fp8amp_" prefix), Java enums (DType, Status, ...) and the option
 * structs (Recipe, LinearDesc, AdamDesc, ...). The hand-written classes of org.fp8amp (Context,
 * Tensor, Scaling, Linear, Optimizer, GradScaler) are the API meant for programs; this layer is the
 * header one to one. Everything language-neutral is in ../swig/fp8amp.i; this file only says how
 * Java values cross JNI:
 *   status       a method returns void; a failed status throws org.fp8amp.Fp8ampException(status, message)
 *   handle       long (the library's opaque value; 0 is NULL)
 *   T *OUTPUT    T[] of length >= 1, element 0 receives the value (uint64_t and size_t: long, bits as is)
 *   arrays       long[] (shapes, handle lists), float[] (history), byte[] / short[] / float[] copies
 *   memory       java.nio.ByteBuffer, direct, whole capacity (zero copy), for tensor_copy_from_host/_to_host
 */
%module(jniclassname="Fp8ampJNI") Fp8amp

%include <stdint.i>
%include "enums.swg"
%javaconst(0);
/* 64-bit integers are Java's long. SWIGWORDSIZE64 (cmake/java.cmake) makes stdint.i spell int64_t
 * as C's long, as glibc does, and SWIG's Java maps a C long to int: map them to long long's
 * typemaps. uint64_t (ScalingStats' counters) too: they stay below 2^63. */
%apply long long { int64_t };
%apply long long { uint64_t };

%{
#include <stdint.h>
#include <string.h>
#include "fp8amp/fp8amp.h"

/* Throws org.fp8amp.Fp8ampException(status, message) with this thread's last message. JNI wants
 * modified UTF-8: the library's messages are ASCII, any other byte becomes '?' rather than risk an
 * invalid string. */
static void fp8amp_java_raise(JNIEnv *jenv, int status) {
  char msg[1024];
  const char *m = fp8amp_last_error_message();
  size_t i = 0;
  jclass cls;
  jmethodID ctor;
  jstring jmsg;
  jobject ex;
  for (; m && m[i] && i + 1 < sizeof msg; ++i) {
    unsigned char c = (unsigned char)m[i];
    msg[i] = (char)(c < 0x80 ? c : '?');
  }
  msg[i] = '\0';
  cls = (*jenv)->FindClass(jenv, "org/fp8amp/Fp8ampException");
  if (!cls) return; /* NoClassDefFoundError is pending */
  ctor = (*jenv)->GetMethodID(jenv, cls, "<init>", "(ILjava/lang/String;)V");
  if (!ctor) return;
  jmsg = (*jenv)->NewStringUTF(jenv, msg);
  if (!jmsg) return;
  ex = (*jenv)->NewObject(jenv, cls, ctor, (jint)status, jmsg);
  if (ex) (*jenv)->Throw(jenv, (jthrowable)ex);
}
#define FP8AMP_SWIG_RAISE(status) fp8amp_java_raise(jenv, (int)(status))

/* What an empty Java array stands for: a valid address of zero bytes (the JVM may give NULL). */
static int64_t fp8amp_java_empty;
%}

/* The JNI library: -Dfp8amp.jni.library=/abs/path/libfp8amp_java.so, else java.library.path. */
%pragma(java) jniclasscode=%{
  static {
    String path = System.getProperty("fp8amp.jni.library");
    if (path != null && !path.isEmpty()) {
      System.load(path);
    } else {
      System.loadLibrary("fp8amp_java");
    }
  }
%}

/* Struct fields in Java's style: in_features -> getInFeatures / setInFeatures. */
%rename("%(lowercamelcase)s", %$ismember, %$isvariable) "";

/* ---- statuses ---------------------------------------------------------------------------------- */
%typemap(jni) fp8amp_status "jint"
%typemap(jtype) fp8amp_status "int"
%typemap(jstype) fp8amp_status "void"
%typemap(out) fp8amp_status %{ $result = (jint)$1; %}
%typemap(javaout) fp8amp_status { $jnicall; }
/* fp8amp_status_name takes the status as a plain int (Fp8ampException.statusCode()). */
%apply int { fp8amp_status status };

/* ---- handles ----------------------------------------------------------------------------------- */
%define FP8AMP_SWIG_HANDLE(TYPE)
%typemap(jni) TYPE "jlong"
%typemap(jtype) TYPE "long"
%typemap(jstype) TYPE "long"
%typemap(in) TYPE %{ $1 = (TYPE)(uintptr_t)$input; %}
%typemap(out) TYPE %{ $result = (jlong)(uintptr_t)$1; %}
%typemap(javain) TYPE "$javainput"
%typemap(javaout) TYPE { return $jnicall; }

%typemap(jni) TYPE *OUTPUT "jlongArray"
%typemap(jtype) TYPE *OUTPUT "long[]"
%typemap(jstype) TYPE *OUTPUT "long[]"
%typemap(javain) TYPE *OUTPUT "$javainput"
%typemap(in) TYPE *OUTPUT ($*1_ltype temp) %{
  if (!$input || (*jenv)->GetArrayLength(jenv, $input) < 1) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "$symname: the output array needs length >= 1");
    return $null;
  }
  temp = 0;
  $1 = &temp;
%}
%typemap(argout) TYPE *OUTPUT %{
  { jlong v_ = (jlong)(uintptr_t)temp$argnum; (*jenv)->SetLongArrayRegion(jenv, $input, 0, 1, &v_); }
%}

%typemap(jni) (int32_t COUNT, const TYPE *HANDLES) "jlongArray"
%typemap(jtype) (int32_t COUNT, const TYPE *HANDLES) "long[]"
%typemap(jstype) (int32_t COUNT, const TYPE *HANDLES) "long[]"
%typemap(javain) (int32_t COUNT, const TYPE *HANDLES) "$javainput"
%typemap(in) (int32_t COUNT, const TYPE *HANDLES) {
  $1 = 0;
  $2 = NULL;
  if ($input) {
    jsize n_ = (*jenv)->GetArrayLength(jenv, $input), i_;
    TYPE *h_ = (TYPE *)malloc(sizeof(TYPE) * (size_t)(n_ > 0 ? n_ : 1));
    jlong *e_;
    if (!h_) { SWIG_JavaThrowException(jenv, SWIG_JavaOutOfMemoryError, "$symname: out of host memory"); return $null; }
    e_ = (*jenv)->GetLongArrayElements(jenv, $input, NULL);
    if (!e_) { free(h_); return $null; }
    for (i_ = 0; i_ < n_; ++i_) h_[i_] = (TYPE)(uintptr_t)e_[i_];
    (*jenv)->ReleaseLongArrayElements(jenv, $input, e_, JNI_ABORT);
    $1 = (int32_t)n_;
    $2 = h_;
  }
}
%typemap(freearg) (int32_t COUNT, const TYPE *HANDLES) { free((void *)$2); }
%enddef

/* ---- scalar out-parameters: T[] of length >= 1 ------------------------------------------------- */
%define FP8AMP_JAVA_OUTPUT(CTYPE, JTYPE, JARR, JELEM, NAME)
%typemap(jni) CTYPE *OUTPUT "JARR"
%typemap(jtype) CTYPE *OUTPUT "JTYPE[]"
%typemap(jstype) CTYPE *OUTPUT "JTYPE[]"
%typemap(javain) CTYPE *OUTPUT "$javainput"
%typemap(in) CTYPE *OUTPUT ($*1_ltype temp) %{
  if (!$input || (*jenv)->GetArrayLength(jenv, $input) < 1) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "$symname: the output array needs length >= 1");
    return $null;
  }
  memset(&temp, 0, sizeof temp);
  $1 = &temp;
%}
%typemap(argout) CTYPE *OUTPUT %{
  { JELEM v_ = (JELEM)temp$argnum; (*jenv)->Set##NAME##ArrayRegion(jenv, $input, 0, 1, &v_); }
%}
%enddef
FP8AMP_JAVA_OUTPUT(int32_t, int, jintArray, jint, Int)
FP8AMP_JAVA_OUTPUT(int64_t, long, jlongArray, jlong, Long)
FP8AMP_JAVA_OUTPUT(uint64_t, long, jlongArray, jlong, Long)
FP8AMP_JAVA_OUTPUT(size_t, long, jlongArray, jlong, Long)
FP8AMP_JAVA_OUTPUT(float, float, jfloatArray, jfloat, Float)
/* enums out: their int value (DType.swigToEnum / GemmKind.swigToEnum) */
FP8AMP_JAVA_OUTPUT(fp8amp_dtype, int, jintArray, jint, Int)
FP8AMP_JAVA_OUTPUT(fp8amp_gemm_kind, int, jintArray, jint, Int)

/* ---- arrays of elements (copied by the JVM as it chooses; read-only ones are not copied back) -- */
%define FP8AMP_JAVA_ARRAY(CTYPE, JTYPE, JARR, JELEM, NAME, LENTYPE)
/* input: (count, array) and (array, length) */
%typemap(jni) (LENTYPE COUNT, const CTYPE *IN_ARRAY) "JARR"
%typemap(jtype) (LENTYPE COUNT, const CTYPE *IN_ARRAY) "JTYPE[]"
%typemap(jstype) (LENTYPE COUNT, const CTYPE *IN_ARRAY) "JTYPE[]"
%typemap(javain) (LENTYPE COUNT, const CTYPE *IN_ARRAY) "$javainput"
%typemap(in) (LENTYPE COUNT, const CTYPE *IN_ARRAY) {
  $1 = 0;
  $2 = NULL;
  if ($input && (*jenv)->GetArrayLength(jenv, $input) > 0) { /* null or empty: 0 and NULL (a scalar's shape) */
    $1 = ($1_ltype)(*jenv)->GetArrayLength(jenv, $input);
    $2 = ($2_ltype)(*jenv)->Get##NAME##ArrayElements(jenv, $input, NULL);
    if (!$2) return $null;
  }
}
%typemap(freearg) (LENTYPE COUNT, const CTYPE *IN_ARRAY) {
  if ($2) (*jenv)->Release##NAME##ArrayElements(jenv, $input, (JELEM *)$2, JNI_ABORT);
}
%typemap(jni) (LENTYPE COUNT, CTYPE *INOUT_ARRAY) "JARR"
%typemap(jtype) (LENTYPE COUNT, CTYPE *INOUT_ARRAY) "JTYPE[]"
%typemap(jstype) (LENTYPE COUNT, CTYPE *INOUT_ARRAY) "JTYPE[]"
%typemap(javain) (LENTYPE COUNT, CTYPE *INOUT_ARRAY) "$javainput"
%typemap(in) (LENTYPE COUNT, CTYPE *INOUT_ARRAY) {
  $1 = 0;
  $2 = NULL;
  if ($input && (*jenv)->GetArrayLength(jenv, $input) > 0) {
    $1 = ($1_ltype)(*jenv)->GetArrayLength(jenv, $input);
    $2 = ($2_ltype)(*jenv)->Get##NAME##ArrayElements(jenv, $input, NULL);
    if (!$2) return $null;
  }
}
%typemap(freearg) (LENTYPE COUNT, CTYPE *INOUT_ARRAY) {
  if ($2) (*jenv)->Release##NAME##ArrayElements(jenv, $input, (JELEM *)$2, 0);
}
%enddef
FP8AMP_JAVA_ARRAY(int64_t, long, jlongArray, jlong, Long, int32_t)
FP8AMP_JAVA_ARRAY(float, float, jfloatArray, jfloat, Float, int32_t)

%define FP8AMP_JAVA_SIZED_ARRAY(CTYPE, JTYPE, JARR, JELEM, NAME)
%typemap(jni) (const CTYPE *IN_ARRAY, size_t LENGTH) "JARR"
%typemap(jtype) (const CTYPE *IN_ARRAY, size_t LENGTH) "JTYPE[]"
%typemap(jstype) (const CTYPE *IN_ARRAY, size_t LENGTH) "JTYPE[]"
%typemap(javain) (const CTYPE *IN_ARRAY, size_t LENGTH) "$javainput"
%typemap(in) (const CTYPE *IN_ARRAY, size_t LENGTH) {
  if (!$input) {
    SWIG_JavaThrowException(jenv, SWIG_JavaNullPointerException, "$symname: the array is null");
    return $null;
  }
  $2 = (size_t)(*jenv)->GetArrayLength(jenv, $input);
  $1 = ($1_ltype)($2 > 0 ? (void *)(*jenv)->Get##NAME##ArrayElements(jenv, $input, NULL) : (void *)&fp8amp_java_empty);
  if (!$1) return $null;
}
%typemap(freearg) (const CTYPE *IN_ARRAY, size_t LENGTH) {
  if ($1 && $2 > 0) (*jenv)->Release##NAME##ArrayElements(jenv, $input, (JELEM *)$1, JNI_ABORT);
}
%typemap(jni) (CTYPE *OUT_ARRAY, size_t LENGTH) "JARR"
%typemap(jtype) (CTYPE *OUT_ARRAY, size_t LENGTH) "JTYPE[]"
%typemap(jstype) (CTYPE *OUT_ARRAY, size_t LENGTH) "JTYPE[]"
%typemap(javain) (CTYPE *OUT_ARRAY, size_t LENGTH) "$javainput"
%typemap(in) (CTYPE *OUT_ARRAY, size_t LENGTH) {
  if (!$input) {
    SWIG_JavaThrowException(jenv, SWIG_JavaNullPointerException, "$symname: the array is null");
    return $null;
  }
  $2 = (size_t)(*jenv)->GetArrayLength(jenv, $input);
  $1 = ($1_ltype)($2 > 0 ? (void *)(*jenv)->Get##NAME##ArrayElements(jenv, $input, NULL) : (void *)&fp8amp_java_empty);
  if (!$1) return $null;
}
%typemap(freearg) (CTYPE *OUT_ARRAY, size_t LENGTH) {
  if ($1 && $2 > 0) (*jenv)->Release##NAME##ArrayElements(jenv, $input, (JELEM *)$1, 0);
}
%enddef
FP8AMP_JAVA_SIZED_ARRAY(int8_t, byte, jbyteArray, jbyte, Byte)
FP8AMP_JAVA_SIZED_ARRAY(int16_t, short, jshortArray, jshort, Short)
FP8AMP_JAVA_SIZED_ARRAY(float, float, jfloatArray, jfloat, Float)

/* optimizer_save's buffer: a byte[] or null (null asks for the size only) */
%typemap(jni) (void *NULLABLE_OUT_BYTES, size_t NBYTES) "jbyteArray"
%typemap(jtype) (void *NULLABLE_OUT_BYTES, size_t NBYTES) "byte[]"
%typemap(jstype) (void *NULLABLE_OUT_BYTES, size_t NBYTES) "byte[]"
%typemap(javain) (void *NULLABLE_OUT_BYTES, size_t NBYTES) "$javainput"
%typemap(in) (void *NULLABLE_OUT_BYTES, size_t NBYTES) {
  $1 = NULL;
  $2 = 0;
  if ($input) {
    $2 = (size_t)(*jenv)->GetArrayLength(jenv, $input);
    $1 = $2 > 0 ? (void *)(*jenv)->GetByteArrayElements(jenv, $input, NULL) : (void *)&fp8amp_java_empty;
    if (!$1) return $null;
  }
}
%typemap(freearg) (void *NULLABLE_OUT_BYTES, size_t NBYTES) {
  if ($1 && $2 > 0) (*jenv)->ReleaseByteArrayElements(jenv, $input, (jbyte *)$1, 0);
}

/* ---- a caller's memory: a direct ByteBuffer, its whole capacity, zero copy --------------------- */
%define FP8AMP_JAVA_DIRECT_BUFFER(PARAMS)
%typemap(jni) PARAMS "jobject"
%typemap(jtype) PARAMS "java.nio.ByteBuffer"
%typemap(jstype) PARAMS "java.nio.ByteBuffer"
%typemap(javain) PARAMS "$javainput"
%typemap(in) PARAMS {
  $1 = NULL;
  $2 = 0;
  if ($input) { /* null: NULL (the library says INVALID_ARGUMENT) */
    jlong cap_ = (*jenv)->GetDirectBufferCapacity(jenv, $input);
    $1 = ($1_ltype)(*jenv)->GetDirectBufferAddress(jenv, $input);
    if (!$1 || cap_ < 0) {
      SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "$symname: the ByteBuffer is not a direct buffer");
      return $null;
    }
    $2 = (size_t)cap_;
  }
}
%enddef
FP8AMP_JAVA_DIRECT_BUFFER((const void *IN_BYTES, size_t NBYTES))
FP8AMP_JAVA_DIRECT_BUFFER((void *OUT_BYTES, size_t NBYTES))

%include "../swig/fp8amp.i"
