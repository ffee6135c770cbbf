"""Fresh environments to check built packages in: a venv with the wheels, or a
conda prefix with the conda packages, and the smoke test run inside them.

pip and indexes: our wheels are installed in a separate ``pip install`` with
``--isolated --no-index`` and only the directories of the given wheels as
``--find-links``. ``--isolated`` drops pip's user configuration and ``PIP_*``
variables (here they add a ``find-links`` directory and extra index URLs: an
``--find-links`` on the command line is *appended* to those, it does not
replace them). So nothing named ``aotriton-rocm*`` can come from an index, even
one that hosts a higher version of a package with that name; a dependency our
wheels need and that is not already installed fails the install instead of
being fetched. torch and triton come first, in an ordinary ``pip install``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from ..package.naming import PackagingError
from ..package.wheels import run_tool

__all__ = [
    "DEFAULT_EXTRA_REQUIREMENTS",
    "clean_env",
    "install_wheels_in_fresh_venv",
    "python_for_conda_prefix",
    "run_smoke",
]

DEFAULT_EXTRA_REQUIREMENTS = ("torch==2.13.0", "triton==3.9.0", "numpy")

# Variables that would make a child interpreter see another environment.
_LEAKY = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV",
          "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "PYTHONEXECUTABLE", "__PYVENV_LAUNCHER__")


def clean_env(base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """A copy of ``base`` (default: os.environ) without the variables that point
    an interpreter at another environment, and with user site-packages off."""
    env = dict(os.environ if base is None else base)
    for k in _LEAKY:
        env.pop(k, None)
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def install_wheels_in_fresh_venv(wheels: Sequence[os.PathLike], venv_dir: os.PathLike,
                                 extra_requirements: Sequence[str] = DEFAULT_EXTRA_REQUIREMENTS,
                                 *, base_python: Optional[os.PathLike] = None) -> Path:
    """Create a new venv at ``venv_dir`` (wiped if it exists), install
    ``extra_requirements`` from the configured indexes, then ``wheels`` with no
    index at all. Returns the venv's python.

    ``wheels`` are paths to our wheel files; every requirement among them (the
    image wheels require the runtime, the runtime's extras the images) must be
    met by these files or by what is already installed.
    """
    vdir = Path(venv_dir).resolve()
    py = Path(base_python or sys.executable)
    run_tool([py, "-m", "venv", "--clear", vdir], f"python -m venv {vdir}", env=clean_env())
    vpy = _venv_python(vdir)
    env = clean_env()
    env["VIRTUAL_ENV"] = str(vdir)
    env["PATH"] = str(vdir / "bin") + os.pathsep + env.get("PATH", "")
    if extra_requirements:
        run_tool([vpy, "-m", "pip", "install", "--disable-pip-version-check", *extra_requirements],
             f"pip install {' '.join(extra_requirements)}", env=env)
    files = [Path(w).resolve() for w in wheels]
    missing = [str(w) for w in files if not w.is_file()]
    if missing:
        raise PackagingError(f"wheels not found: {missing}")
    if files:
        links = []
        for d in dict.fromkeys(w.parent for w in files):
            links += ["--find-links", str(d)]
        run_tool([vpy, "-m", "pip", "install", "--isolated", "--disable-pip-version-check", "--no-index",
              *links, *map(str, files)], "pip install (our wheels, no index)", env=env)
    return vpy


def _site_packages_of(python: os.PathLike) -> list:
    """purelib/platlib of another interpreter."""
    code = ("import sysconfig, json; print(json.dumps(sorted({sysconfig.get_path('purelib'), "
            "sysconfig.get_path('platlib')})))")
    out = run_tool([python, "-c", code], f"{python}: site-packages", env=clean_env()).stdout
    import json

    return json.loads(out.strip().splitlines()[-1])


def python_for_conda_prefix(prefix: os.PathLike, *, host_python: Optional[os.PathLike] = None
                            ) -> Tuple[Path, Dict[str, str]]:
    """The interpreter and environment that run what is installed in the conda
    environment ``prefix`` (as ``conda activate`` + ``python`` would).

    * ``prefix`` has a conda python (a real environment): that python, with
      ``prefix/bin`` first on PATH and ``CONDA_PREFIX`` set.
    * ``prefix`` has none (built and installed offline, where no channel with a
      python package is reachable): ``host_python`` (default: this interpreter,
      which must be the same Python minor as the runtime installed there) is laid
      over the prefix as a venv (``python -m venv --without-pip``: pyvenv.cfg and
      bin/python), so that ``sys.prefix`` is the conda prefix and its
      ``lib/python3.N/site-packages`` is the site directory, exactly as with a
      conda python; a ``.pth`` file appends the host interpreter's own
      site-packages (torch) *after* the prefix's. Nothing is added to
      ``conda-meta``: conda does not see the overlay as a package.
    """
    pfx = Path(prefix).resolve()
    if not (pfx / "conda-meta").is_dir():
        raise PackagingError(f"{pfx} is not a conda environment (no conda-meta/)")
    env = clean_env()
    env["CONDA_PREFIX"] = str(pfx)
    env["PATH"] = str(pfx / "bin") + os.pathsep + env.get("PATH", "")
    conda_python = any(p.name.startswith("python-") and p.name[len("python-"):][:1].isdigit()
                       for p in (pfx / "conda-meta").glob("python-*.json"))
    if conda_python and (pfx / "bin" / "python").exists():
        return pfx / "bin" / "python", env

    host = Path(host_python or sys.executable)
    ver = run_tool([host, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
               f"{host} --version", env=clean_env()).stdout.strip().splitlines()[-1]
    sp = pfx / "lib" / f"python{ver}" / "site-packages"
    if not sp.is_dir():
        have = sorted(p.name for p in (pfx / "lib").glob("python3.*")) if (pfx / "lib").is_dir() else []
        raise PackagingError(f"{pfx} has no lib/python{ver}/site-packages for {host} "
                             f"(installed for: {have or 'no Python'}); install the py{ver.replace('.', '')} build")
    if not (pfx / "pyvenv.cfg").is_file():
        run_tool([host, "-m", "venv", "--without-pip", pfx], f"venv overlay on {pfx}", env=clean_env())
    host_sites = [p for p in _site_packages_of(host) if Path(p).resolve() != sp.resolve()]
    (sp / "_aotriton_rocm_host_site.pth").write_text("".join(f"{p}\n" for p in host_sites),
                                                     encoding="utf-8")
    return pfx / "bin" / "python", env


def run_smoke(python: os.PathLike, env: Optional[Dict[str, str]] = None,
              args: Sequence[str] = (), *, timeout: float = 900) -> subprocess.CompletedProcess:
    """``python -m aotriton_rocm smoke [args]`` in ``env``; output captured
    (stdout and stderr together, text). The caller checks ``returncode``."""
    return subprocess.run([str(python), "-m", "aotriton_rocm", "smoke", *args],
                          env=clean_env() if env is None else env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
