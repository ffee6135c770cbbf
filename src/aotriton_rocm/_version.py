"""Single source of the package version and the ABI line it belongs to, and
the one place that says how a version maps to its ABI line."""

__version__ = "0.1.0"
# The exact compiler every shipped code object is built with.
TRITON_VERSION = "3.9.0"


def public_version(version: str) -> str:
    """``X.Y.Z`` of ``X.Y.Z+rocmA.B``: the version without its local label."""
    return str(version).split("+", 1)[0]


def abi_line(version: str) -> str:
    """``X.Y`` of ``X.Y.Z`` (or ``X.Y.Z+local``): point releases of one ABI
    line are drop-in compatible."""
    return ".".join(public_version(version).split(".")[:2])


ABI_VERSION = abi_line(__version__)
