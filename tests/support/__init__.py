"""Helpers the tests share: independent references (attention in float64,
the numpy Philox model, flash-attn's S_dmask normalisation), real archive
and release fixtures, a local package index, the toy kernel build. Test
modules import these, never each other."""
