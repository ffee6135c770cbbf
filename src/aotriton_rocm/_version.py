"""Single source of the package version and the ABI line it belongs to."""

__version__ = "0.1.0"
# X.Y of the version: point releases of one ABI line are drop-in compatible.
ABI_VERSION = ".".join(__version__.split(".")[:2])
# The exact compiler every shipped code object is built with.
TRITON_VERSION = "3.9.0"
