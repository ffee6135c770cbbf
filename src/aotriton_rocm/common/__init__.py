"""Layer 0 of the runtime: the leaves every other layer reads. Standard
library only (``images`` and ``paths`` excepted: entry points, install
locations): errors, files, paths, the archive format's reader and the
identity checks of an archive, kernel ABI records, image discovery, ELF
dynamic sections, trace spans and the torch operator schemas."""
