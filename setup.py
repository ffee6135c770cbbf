"""setuptools hooks beyond pyproject.toml: libaotriton_rocm (native/), the C
library, is compiled into the runtime wheel as ``aotriton_rocm/lib/
libaotriton_rocm.so.<ABI line>`` (a plain shared library with a version
script, not a Python extension), and its public header is shipped as
``aotriton_rocm/include/aotriton_rocm/aotriton_rocm.h``."""

import re
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
NATIVE = "native"
VERSION = re.search(r'^__version__\s*=\s*"([^"]+)"',
                    (HERE / "src/aotriton_rocm/_version.py").read_text(), re.M).group(1)
ABI_LINE = ".".join(VERSION.split("+")[0].split(".")[:2])
SONAME = f"libaotriton_rocm.so.{ABI_LINE}"
LIBRARY = "aotriton_rocm.lib.libaotriton_rocm"
# The warning set of native/CMakeLists.txt.
WARNINGS = ["-Wall", "-Wextra", "-Wpedantic", "-Wshadow", "-Wstrict-prototypes",
            "-Wmissing-prototypes", "-Wconversion", "-Wno-sign-conversion", "-Wformat=2",
            "-Werror"]


def copy_header(package: Path) -> None:
    include = package / "include" / "aotriton_rocm"
    include.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / NATIVE / "include/aotriton_rocm/aotriton_rocm.h", include / "aotriton_rocm.h")


def render_package_files(package: Path) -> None:
    """lib/cmake/aotriton_rocm/ and lib/pkgconfig/ from native/{cmake,pkgconfig}/*.in,
    as native/CMakeLists.txt renders them for its install()."""
    major, minor = ABI_LINE.split(".")
    values = {"AOTR_VERSION": VERSION.split("+")[0], "AOTR_VERSION_MAJOR": major,
              "AOTR_VERSION_MINOR": minor, "AOTR_ABI_LINE": ABI_LINE, "AOTR_SONAME": SONAME}
    for template, dest in (("cmake/aotriton_rocmConfig.cmake", "cmake/aotriton_rocm"),
                           ("cmake/aotriton_rocmConfigVersion.cmake", "cmake/aotriton_rocm"),
                           ("pkgconfig/aotriton_rocm.pc", "pkgconfig")):
        text = (HERE / NATIVE / f"{template}.in").read_text()
        out = package / "lib" / dest / Path(template).name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(re.sub(r"@(\w+)@", lambda m: values[m.group(1)], text))


class BuildExt(build_ext):
    def get_ext_filename(self, fullname):
        # asked with the dotted name and with its last part
        if fullname == LIBRARY:
            return str(Path(*LIBRARY.split(".")[:-1], SONAME))
        if fullname == LIBRARY.rsplit(".", 1)[1]:
            return SONAME
        return super().get_ext_filename(fullname)

    def copy_extensions_to_source(self):
        # editable installs: the package's lib/ (and include/) exist only as build outputs
        package = Path(self.get_finalized_command("build_py").get_package_dir("aotriton_rocm"))
        (package / "lib").mkdir(exist_ok=True)
        copy_header(package)
        render_package_files(package)
        super().copy_extensions_to_source()

    def get_export_symbols(self, ext):
        # the version script decides what the library exports (no PyInit_*)
        return [] if ext.name == LIBRARY else super().get_export_symbols(ext)


class BuildPy(build_py):
    def run(self):
        super().run()
        copy_header(Path(self.build_lib, "aotriton_rocm"))
        render_package_files(Path(self.build_lib, "aotriton_rocm"))


library = Extension(
    LIBRARY,
    sources=sorted(str(p.relative_to(HERE)) for p in (HERE / NATIVE / "src").glob("*.c")),
    include_dirs=[f"{NATIVE}/include", f"{NATIVE}/src"],
    define_macros=[("_GNU_SOURCE", None)],
    extra_compile_args=["-std=c11", "-fvisibility=hidden", "-include",
                        f"{NATIVE}/src/glibc_compat.h", *WARNINGS],
    extra_link_args=[f"-Wl,-soname,{SONAME}",
                     f"-Wl,--version-script={NATIVE}/src/libaotriton_rocm.map",
                     "-Wl,--no-undefined", "-Wl,-z,defs",
                     # named even where glibc >= 2.34 folded them into libc:
                     # glibc 2.28 has dlopen & co. there (see glibc_compat.h)
                     "-Wl,--no-as-needed", "-l:libdl.so.2", "-l:libpthread.so.0", "-Wl,--as-needed"],
    py_limited_api=True,
)

setup(ext_modules=[library], cmdclass={"build_ext": BuildExt, "build_py": BuildPy})
