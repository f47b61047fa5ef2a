# The project's metadata is in pyproject.toml; setup.py only hands cffi its build script, which
# generates the cdef from the public header and compiles the extension module (API mode).
from setuptools import setup

setup(cffi_modules=["build_ffi.py:ffibuilder"])
