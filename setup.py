# The only reason this file exists: cffi's setuptools hook is the
# ``cffi_modules`` keyword, which pyproject.toml cannot carry.
from setuptools import setup

setup(
    cffi_modules=["csrc/build_core.py:ffi"],
    # cffi builds the extension against the stable ABI (reaper/_core.abi3.so): tag the wheel
    # cp39-abi3, so that one wheel serves every CPython >= 3.9.
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
