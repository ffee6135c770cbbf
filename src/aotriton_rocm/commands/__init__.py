"""Layer 3: the ``aotriton-rocm`` command (``cli``) and its runtime commands
(smoke, info, config, aotriton-prefix, torch-dropin). The build, package,
release and tune commands live in :mod:`aotriton_rocm.tooling` (layer 4)."""
