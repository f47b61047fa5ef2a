/* fp8amp/version.h: the version of the library and of this header -- its one source. CMakeLists.txt
 * reads these three numbers into project(VERSION) (the library's file name and SONAME, the package
 * files), bindings/python takes the package version from here, and tests/contract/check.sh holds the
 * linker map's newest version node to it. A checked-in file, not a generated one, so that fp8amp.h
 * compiles from capi/include alone. */
#ifndef FP8AMP_VERSION_H
#define FP8AMP_VERSION_H

/** @addtogroup version
 *  @{ */

/** Major version of the header: a new major breaks the ABI (new SONAME, new version node). */
#define FP8AMP_VERSION_MAJOR 0
/** Minor version of the header: additions only, within the major's ABI. */
#define FP8AMP_VERSION_MINOR 4
/** Patch version of the header: fixes, no API change. */
#define FP8AMP_VERSION_PATCH 0
/** The version this header describes, as major * 10000 + minor * 100 + patch. */
#define FP8AMP_VERSION (FP8AMP_VERSION_MAJOR * 10000 + FP8AMP_VERSION_MINOR * 100 + FP8AMP_VERSION_PATCH)

/** @} */

#endif /* FP8AMP_VERSION_H */
