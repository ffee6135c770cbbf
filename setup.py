"""setuptools hooks beyond pyproject.toml: libaotriton_rocm (native/), the C
library, is compiled into the runtime wheel as ``aotriton_rocm/lib/
libaotriton_rocm.so.<ABI line>`` (a plain shared library with a version
script, not a Python extension), and its public header is shipped as
``aotriton_rocm/include/aotriton_rocm/aotriton_rocm.h``.

When torch's headers are at hand (AOTRITON_ROCM_TORCH_INCLUDE, or an
importable torch >= 2.10 in the build environment), the torch extension
native/torch/ is compiled beside it as ``aotriton_rocm/lib/
libaotriton_rocm_torch.so`` (torch's stable ABI; no link-time libtorch).

libaotriton_v2, upstream AOTriton's C++ API over the same core (native/
aotriton_api/, the core's sources compiled in), is built once per API line
as ``aotriton_rocm/lib/aotriton_api/<line>/libaotriton_v2.so.<version>``
with its headers in ``aotriton_rocm/include/aotriton_api/<line>/aotriton/``
(native/aotriton_api/CMakeLists.txt builds and installs the same).

The sources and warnings come from native/sources.cmake (CMake's too); the
argument-slot tables the core includes are written from kernels/variants.toml
by native/gen_slots.py into the build directory first."""

import os
import re
import runpy
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.errors import CompileError
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
NATIVE = "native"
# _version.py is a stdlib-only leaf: the one place that maps a version to its ABI line
_VERSION_MODULE = runpy.run_path(str(HERE / "src/aotriton_rocm/_version.py"))
VERSION = _VERSION_MODULE["__version__"]
ABI_LINE = _VERSION_MODULE["abi_line"](VERSION)
SONAME = f"libaotriton_rocm.so.{ABI_LINE}"
LIBRARY = "aotriton_rocm.lib.libaotriton_rocm"
TORCH_LIBRARY = "aotriton_rocm.lib.libaotriton_rocm_torch"
# libaotriton_v2's API lines: (directory, AOTriton version, AOTRITON_ROCM_API_LINE),
# as in native/aotriton_api/CMakeLists.txt
API_LINES = (("0.11", "0.11.2", 11), ("0.13", "0.13.0", 13), ("0.14", "0.14.0", 14))
API_DIR = HERE / NATIVE / "aotriton_api"
API_EXTENSIONS = {f"aotriton_rocm.lib.aotriton_api_{line.replace('.', '_')}": (line, version, api)
                  for line, version, api in API_LINES}
# native/sources.cmake: its set() lists, by name
SOURCES = {name: words.split() for name, words in
           re.findall(r"set\((\w+)\s+([^)]*)\)",
                      re.sub(r"#.*", "", (HERE / NATIVE / "sources.cmake").read_text()))}
CORE_SOURCES = [f"{NATIVE}/{path}" for path in SOURCES["AOTR_CORE_SOURCES"]]
API_SOURCES = [f"{NATIVE}/aotriton_api/{path}" for path in SOURCES["AOTR_API_SOURCES"]]
TORCH_SOURCES = [f"{NATIVE}/torch/{path}" for path in SOURCES["AOTR_TORCH_SOURCES"]]
API_CXX_FLAGS = ["-std=c++17", "-fvisibility=hidden", "-fvisibility-inlines-hidden",
                 *SOURCES["AOTR_API_CXX_WARNINGS"], "-Werror"]
WARNINGS = [*SOURCES["AOTR_WARNINGS"], "-Werror"]
VARIANTS = "kernels/variants.toml"
GEN_SLOTS = f"{NATIVE}/gen_slots.py"


def copy_header(package: Path) -> None:
    include = package / "include" / "aotriton_rocm"
    include.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / NATIVE / "include/aotriton_rocm/aotriton_rocm.h", include / "aotriton_rocm.h")


def render_api_config(line: str, version: str, api_line: int) -> str:
    """config.h of one libaotriton_v2 line (CMake's configure_file @ONLY)."""
    major, minor, patch = version.split(".")
    values = {"AOTRITON_VERSION_MAJOR": major, "AOTRITON_VERSION_MINOR": minor,
              "AOTRITON_VERSION_PATCH": patch, "AOTRITON_ROCM_API_LINE": str(api_line),
              "AOTRITON_ROCM_VERSION": _VERSION_MODULE["public_version"](VERSION)}
    return re.sub(r"@(\w+)@", lambda m: values[m.group(1)], (API_DIR / "config.h.in").read_text())


def copy_api_headers(package: Path) -> None:
    for line, version, api_line in API_LINES:
        dest = package / "include" / "aotriton_api" / line / "aotriton"
        if dest.exists():
            shutil.rmtree(dest)
        # v2/ up to 0.13, flash/ from 0.14 on (as the CMake install)
        skip = "v2" if api_line >= 14 else "flash"
        shutil.copytree(API_DIR / "include" / "aotriton", dest,
                        ignore=lambda d, names: [skip] if Path(d) == API_DIR / "include" / "aotriton" else [])
        (dest / "config.h").write_text(render_api_config(line, version, api_line))


def torch_include_dir():
    """torch's include directory, or None (then the extension is skipped)."""
    env = os.environ.get("AOTRITON_ROCM_TORCH_INCLUDE")
    if env:
        return env
    try:
        import torch
        from torch.utils.cpp_extension import include_paths
    except ImportError:
        return None
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 10):
        return None
    return next((p for p in include_paths()
                 if Path(p, "torch/csrc/stable/library.h").is_file()), None)


def torch_extension():
    """libaotriton_rocm_torch (native/torch/CMakeLists.txt builds the same)."""
    include = torch_include_dir()
    if include is None:
        print("note: no torch >= 2.10 headers (set AOTRITON_ROCM_TORCH_INCLUDE): building "
              "without libaotriton_rocm_torch; torch >= 2.10 then uses the Python route")
        return None
    return Extension(
        TORCH_LIBRARY,
        sources=TORCH_SOURCES,
        depends=[f"{NATIVE}/torch/torch_internal.h", f"{NATIVE}/torch/aotriton_rocm_torch.h"],
        language="c++",
        include_dirs=[f"{NATIVE}/include"],
        # the oldest torch served: 2.10, encoded as torch/headeronly/version.h does
        define_macros=[("TORCH_TARGET_VERSION", "0x020a000000000000")],
        # -O2: inlined, the C++ runtime's newest helpers are not referenced (the
        # wheel stays manylinux_2_28); -g0: no build directory in the binary
        extra_compile_args=["-std=c++17", "-O2", "-g0", "-fvisibility=hidden",
                            "-fvisibility-inlines-hidden",
                            "-isystem", include, "-include", f"{NATIVE}/src/glibc_compat.h",
                            "-Wall", "-Wextra", "-Werror"],
        # libtorch stays undefined (no -z defs); libaotriton_rocm is found beside it
        extra_link_args=[f"-Wl,--version-script={NATIVE}/torch/libaotriton_rocm_torch.map",
                         "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags", "-Wl,--no-as-needed",
                         f"-l:{SONAME}", "-l:libdl.so.2", "-Wl,--as-needed"],
        py_limited_api=True,
    )


def render_package_files(package: Path) -> None:
    """lib/cmake/aotriton_rocm/ and lib/pkgconfig/ from native/{cmake,pkgconfig}/*.in,
    as native/CMakeLists.txt renders them for its install()."""
    major, minor = ABI_LINE.split(".")
    values = {"AOTR_VERSION": _VERSION_MODULE["public_version"](VERSION), "AOTR_VERSION_MAJOR": major,
              "AOTR_VERSION_MINOR": minor, "AOTR_ABI_LINE": ABI_LINE, "AOTR_SONAME": SONAME}
    for template, dest in (("cmake/aotriton_rocmConfig.cmake", "cmake/aotriton_rocm"),
                           ("cmake/aotriton_rocmConfigVersion.cmake", "cmake/aotriton_rocm"),
                           ("pkgconfig/aotriton_rocm.pc", "pkgconfig")):
        text = (HERE / NATIVE / f"{template}.in").read_text()
        out = package / "lib" / dest / Path(template).name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(re.sub(r"@(\w+)@", lambda m: values[m.group(1)], text))


class BuildExt(build_ext):
    def run(self):
        # the argument-slot tables (native/CMakeLists.txt's aotr_slots)
        self.slots_dir = str(Path(self.build_temp, "generated"))
        if runpy.run_path(GEN_SLOTS)["main"]([VARIANTS, self.slots_dir, *CORE_SOURCES]):
            raise CompileError(f"{GEN_SLOTS}: {VARIANTS} and the C core disagree (see above)")
        super().run()

    def get_ext_filename(self, fullname):
        # asked with the dotted name and with its last part
        names = [(LIBRARY, SONAME), (TORCH_LIBRARY, "libaotriton_rocm_torch.so")]
        names += [(name, f"aotriton_api/{line}/libaotriton_v2.so.{version}")
                  for name, (line, version, _) in API_EXTENSIONS.items()]
        for name, filename in names:
            if fullname == name:
                return str(Path(*name.split(".")[:-1], filename))
            if fullname == name.rsplit(".", 1)[1]:
                return filename
        return super().get_ext_filename(fullname)

    def _get_inplace_equivalent(self, build_py, ext):
        # editable installs: the API libraries keep their aotriton_api/<line>/ directory
        inplace, regular = super()._get_inplace_equivalent(build_py, ext)
        if ext.name in API_EXTENSIONS:
            line = API_EXTENSIONS[ext.name][0]
            inplace = os.path.join(os.path.dirname(inplace), "aotriton_api", line, os.path.basename(inplace))
        return inplace, regular

    def build_api_library(self, ext):
        """One libaotriton_v2: the core's C sources and the layer's C++ ones,
        each with its own flags, linked with the C++ driver."""
        line, version, api_line = API_EXTENSIONS[ext.name]
        temp = Path(self.build_temp, "aotriton_api", line)
        config = temp / "include" / "aotriton" / "config.h"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(render_api_config(line, version, api_line))
        # -g0: no build directory in the binary (as the torch extension)
        compat = ["-include", f"{NATIVE}/src/glibc_compat.h", "-O2", "-g0"]
        cc = self.compiler
        cc.compiler_so = [f for f in cc.compiler_so if f != "-Wstrict-prototypes"]
        objects = cc.compile(CORE_SOURCES, output_dir=str(temp / "core"), macros=[("_GNU_SOURCE", None)],
                             include_dirs=[f"{NATIVE}/include", f"{NATIVE}/src", self.slots_dir],
                             extra_postargs=["-std=c11", "-fvisibility=hidden", *compat, *WARNINGS])
        objects += cc.compile(API_SOURCES, output_dir=str(temp / "layer"),
                              macros=[("aotriton_v2_EXPORTS", None), ("AOTRITON_ROCM_NO_HIP_RUNTIME_H", None)],
                              include_dirs=[str(temp / "include"), str(API_DIR / "include"), f"{NATIVE}/include"],
                              extra_postargs=[*API_CXX_FLAGS, *compat])
        cc.link_shared_object(
            objects, self.get_ext_fullpath(ext.name), target_lang="c++",
            extra_postargs=[f"-Wl,-soname,libaotriton_v2.so.{version}",
                            f"-Wl,--version-script={API_DIR / 'libaotriton_v2.map'}",
                            "-Wl,--no-undefined", "-Wl,-z,defs", "-Wl,--no-as-needed",
                            "-l:libdl.so.2", "-l:libpthread.so.0", "-Wl,--as-needed"])

    def build_extension(self, ext):
        if ext.name in API_EXTENSIONS:
            return self.build_api_library(ext)
        if ext.name == LIBRARY:
            ext.include_dirs.append(self.slots_dir)
        if ext.name == TORCH_LIBRARY:
            # linked against the libaotriton_rocm just built (listed first)
            ext.library_dirs = [str(Path(self.get_ext_fullpath(LIBRARY)).parent)]
            # Python's C flags (-Wstrict-prototypes, ...) are C-only: g++ warns about them
            self.compiler.compiler_so = [f for f in self.compiler.compiler_so
                                         if f != "-Wstrict-prototypes"]
        super().build_extension(ext)

    def copy_extensions_to_source(self):
        # editable installs: the package's lib/ (and include/) exist only as build outputs
        package = Path(self.get_finalized_command("build_py").get_package_dir("aotriton_rocm"))
        (package / "lib").mkdir(exist_ok=True)
        for line, _, _ in API_LINES:
            (package / "lib" / "aotriton_api" / line).mkdir(parents=True, exist_ok=True)
        copy_header(package)
        copy_api_headers(package)
        render_package_files(package)
        super().copy_extensions_to_source()

    def get_export_symbols(self, ext):
        # the version script decides what the library exports (no PyInit_*)
        if ext.name in (LIBRARY, TORCH_LIBRARY) or ext.name in API_EXTENSIONS:
            return []
        return super().get_export_symbols(ext)


class BuildPy(build_py):
    def run(self):
        super().run()
        copy_header(Path(self.build_lib, "aotriton_rocm"))
        copy_api_headers(Path(self.build_lib, "aotriton_rocm"))
        render_package_files(Path(self.build_lib, "aotriton_rocm"))


library = Extension(
    LIBRARY,
    sources=CORE_SOURCES,
    include_dirs=[f"{NATIVE}/include", f"{NATIVE}/src"],  # + the slot tables' (BuildExt.run)
    depends=[VARIANTS, GEN_SLOTS, f"{NATIVE}/sources.cmake"],
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

# built by BuildExt.build_api_library (the sources listed for setuptools' bookkeeping)
api_libraries = [Extension(name, sources=API_SOURCES, language="c++", py_limited_api=True)
                 for name in API_EXTENSIONS]

extensions = [library, *api_libraries, torch_extension()]
setup(ext_modules=[e for e in extensions if e is not None], cmdclass={"build_ext": BuildExt, "build_py": BuildPy})
