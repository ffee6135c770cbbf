"""The default softmax scale, libaotriton_rocm's ``aotr_attn_default_scale``
(the one place of the rule, which every route asks), against math.sqrt."""

from __future__ import annotations

import math
import struct

from aotriton_rocm.core import native


def _f32(x: float) -> bytes:
    return struct.pack("<f", x)


def test_default_scale_is_the_float_of_one_over_sqrt_head_dim():
    for d in range(1, 4097):
        got = native.default_scale(d)
        want = 1.0 / math.sqrt(d)
        assert _f32(got) == _f32(want), d  # the kernels take it as a float
        assert math.isclose(got, want, rel_tol=2**-51), d


def test_default_scale_without_a_head_dim_is_one():
    assert native.default_scale(0) == native.default_scale(-3) == 1.0
