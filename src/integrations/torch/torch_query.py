"""Prints what building against the running Python's torch needs, one
`name=value` line each (read by CMakeLists.txt). Exit 1 when torch does not
import, with the reason on stderr."""
import sys
import sysconfig

try:
    import torch
    from torch.utils import cpp_extension
except Exception as e:  # the reason goes to the configure log
    sys.stderr.write(f"torch does not import: {e}\n")
    sys.exit(1)

C = torch._C
values = {
    "VERSION": torch.__version__,
    "INCLUDE_DIRS": "|".join(cpp_extension.include_paths()),  # "|": CMake lists use ";"
    "LIBRARY_DIR": cpp_extension.library_paths()[0],
    "CXX11_ABI": str(int(C._GLIBCXX_USE_CXX11_ABI)),
    # pybind11 keeps its type registry per ABI: these must match torch's.
    "PYBIND11_COMPILER_TYPE": getattr(C, "_PYBIND11_COMPILER_TYPE", "") or "",
    "PYBIND11_STDLIB": getattr(C, "_PYBIND11_STDLIB", "") or "",
    "PYBIND11_BUILD_ABI": getattr(C, "_PYBIND11_BUILD_ABI", "") or "",
    "PYTHON_INCLUDE": sysconfig.get_paths()["include"],
    "EXT_SUFFIX": sysconfig.get_config_var("EXT_SUFFIX"),
    "SITE_PACKAGES": sysconfig.get_paths()["purelib"],
}
for k, v in values.items():
    print(f"{k}={v}")
