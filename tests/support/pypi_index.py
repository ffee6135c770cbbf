"""A package index with per-ROCm paths for the publishing tests: ONE
pypiserver process on 127.0.0.1 serving several indexes, each at its own URL
path (``/`` the default index, ``/rocm6.4/`` the ROCm 6.4 one, ...), all with
the same htpasswd file guarding uploads.

pypiserver's command line serves one index per process (several package
directories given to one ``pypi-server run`` are merged into one index), but
its WSGI application takes the same arguments (``pypiserver.Config.from_args``
+ ``pypiserver.app_from_config``, the API its documentation gives for running
it under another WSGI server) and can be instantiated once per directory. This
module mounts one such application per path under a small path dispatcher (the
``SCRIPT_NAME`` / ``PATH_INFO`` split of WSGI, so pypiserver's links carry the
prefix) and serves them with the standard library's threaded WSGI server. The
same layout in production: one ``WSGIScriptAlias /rocm6.4 ...`` (or gunicorn
mount) per index with ``pypiserver.app(...)``.

Run as ``python tests/support/pypi_index.py --port P --htpasswd FILE [NAME=DIR]...``
(``=DIR`` alone: the default index at ``/``); :class:`IndexServer` does that
in a subprocess and waits until every path answers.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Callable, Dict, Iterable, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

START_TIMEOUT = 30.0


def pypiserver_app(root: Path, htpasswd: Path) -> Callable:
    """The WSGI app of ``pypi-server run -P HTPASSWD -a update --disable-fallback ROOT``."""
    import pypiserver
    from pypiserver.config import Config

    config = Config.from_args(["run", "-P", str(htpasswd), "-a", "update", "--disable-fallback",
                               str(root)])
    return pypiserver.setup_routes_from_config(pypiserver.app_from_config(config), config)


def dispatcher(apps: Dict[str, Callable]) -> Callable:
    """WSGI app routing ``/NAME/...`` to ``apps[NAME]`` (moving ``/NAME`` from
    PATH_INFO to SCRIPT_NAME) and everything else to ``apps[""]``."""
    def app(environ, start_response):
        path = environ.get("PATH_INFO", "") or "/"
        first = path.lstrip("/").split("/", 1)[0]
        if first and first in apps:
            environ = dict(environ)
            environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "").rstrip("/") + "/" + first
            environ["PATH_INFO"] = path[len(first) + 1:] or "/"
            return apps[first](environ, start_response)
        if "" in apps:
            return apps[""](environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"no index at this path\n"]

    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, fmt, *args):  # one line per request, to stderr (the log file)
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))


def serve(port: int, htpasswd: Path, indexes: Dict[str, Path]) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    apps = {name: pypiserver_app(root, htpasswd) for name, root in indexes.items()}
    with make_server("127.0.0.1", port, dispatcher(apps), server_class=_ThreadingServer,
                     handler_class=_QuietHandler) as httpd:
        httpd.serve_forever()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_env(**extra) -> dict:
    """The environment for index, twine and pip subprocesses: no PIP_*/TWINE_*
    settings of the caller, and no keyring lookups."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "TWINE_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON_KEYRING_BACKEND="keyring.backends.null.Keyring", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.update(extra)
    return env


class IndexServer:
    """The server above in a subprocess, one index per name (``""`` = ``/``);
    ``url(name)`` is the upload URL, ``simple(name)`` the ``--index-url``."""

    def __init__(self, base: Path, htpasswd: Path, names: Iterable[str]):
        self.roots: Dict[str, Path] = {}
        for name in names:
            root = base / (name or "default")
            root.mkdir(parents=True, exist_ok=True)
            self.roots[name] = root
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/"
        self.log = base / "pypiserver.log"
        self._log = open(self.log, "wb")
        args = [f"{name}={root}" for name, root in self.roots.items()]
        self.proc: Optional[subprocess.Popen] = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--port", str(self.port),
             "--htpasswd", str(htpasswd), *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=quiet_env())
        deadline = time.monotonic() + START_TIMEOUT
        pending = list(self.roots)
        while pending:
            if self.proc.poll() is not None:
                self._log.close()
                raise RuntimeError(f"index server exited ({self.proc.returncode}): "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.simple(pending[0]), timeout=2) as r:
                    if r.status == 200:
                        pending.pop(0)
                        continue
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"index server did not answer in {START_TIMEOUT}s: "
                                   f"{self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def url(self, name: str = "") -> str:
        return self.base_url + (f"{name}/" if name else "")

    def simple(self, name: str = "") -> str:
        return self.url(name) + "simple/"

    def files(self, name: str = "") -> list:
        return sorted(p.name for p in self.roots[name].iterdir())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        if not self._log.closed:
            self._log.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--htpasswd", required=True)
    p.add_argument("indexes", nargs="+", metavar="NAME=DIR")
    a = p.parse_args(argv)
    indexes = {}
    for spec in a.indexes:
        name, sep, root = spec.partition("=")
        if not sep or not root or "/" in name:
            p.error(f"{spec!r}: want NAME=DIR (NAME without '/'; empty NAME: the default index)")
        indexes[name] = Path(root).resolve()
    serve(a.port, Path(a.htpasswd), indexes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
