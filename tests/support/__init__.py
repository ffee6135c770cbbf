"""Helpers the tests share: independent references (attention in float64,
the numpy Philox model, flash-attn's S_dmask normalisation), real archive
and release fixtures, a local package index, the toy kernel build. Test
modules import these, never each other."""

# Names the directory of one whole test run, made by tests/conftest.py and
# inherited by the xdist workers (tests/support/toy_release.py builds there).
SHARED_ENV = "AOTRITON_TEST_SHARED_DIR"
