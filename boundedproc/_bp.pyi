# Type stub for the cffi extension built from csrc/ (see csrc/build_ffi.py).
from typing import Any

ffi: Any
lib: Any
