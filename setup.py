"""The package's one compiled part: stampede/oploop.c, the metadata ops of a timed phase in
one C call (a plain C library, no Python API, loaded by stampede/oploop.py with ctypes).
Optional: where no C compiler is, the install goes on without it and a rank runs the same
ops in Python. Everything else about the package is in setup.cfg."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("stampede._oploop", ["stampede/oploop.c"], optional=True,
                             extra_compile_args=["-O2"])])
