"""Build the optional C kernels (apps/experts/_qdot.c); everything else is in pyproject.toml.

The extension is optional at run time: without it (no compiler at install time) the expert
backend falls back to the numba kernels.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("apps.experts._qdot", ["apps/experts/_qdot.c"], extra_compile_args=["-O3"],
                                 optional=True)])
