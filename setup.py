# The only reason this file exists: cffi's setuptools hook is the
# ``cffi_modules`` keyword, which pyproject.toml cannot carry.
from setuptools import setup

setup(cffi_modules=["csrc/build_core.py:ffi"])
