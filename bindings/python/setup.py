# The project's metadata is in pyproject.toml; setup.py hands cffi its build script, which generates
# the cdef from the public headers and compiles the extension module (API mode), and gives the
# package its version: the header's (fp8amp/version.h, which CMake generates from its project version,
# the one source of the version), read from the headers the module is built against.
import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_ffi  # noqa: E402

setup(version=build_ffi.version(build_ffi.locate()[0]), cffi_modules=["build_ffi.py:ffibuilder"])
