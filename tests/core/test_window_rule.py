"""The window rule in its one place, libaotriton_rocm's aotr_attn_window
(flash-attn's window_size normalisation, as its mha_fwd applies it), as the
Python routes reach it: checked against the rule written out here."""

from __future__ import annotations

import itertools

import pytest

from aotriton_rocm.core import attention, native


def _flash_attn_rule(left, right, causal, seqlen_k):
    sides = [-1 if w is None or w < 0 or w >= seqlen_k else w for w in (left, right)]
    if causal:
        sides[1] = 0
    return tuple(sides)


SIDES = [None, -5, -1, 0, 1, 7, 63, 64, 65, 2**31 - 1, 2**31, 2**62]


@pytest.mark.parametrize("seqlen_k", [0, 1, 64, 4096])
def test_every_side_follows_flash_attn_rule(seqlen_k):
    for left, right, causal in itertools.product(SIDES, SIDES, (False, True)):
        want = _flash_attn_rule(left, right, causal, seqlen_k)
        assert native.attn_window(left, right, causal, seqlen_k) == want, (left, right, causal)


def test_python_routes_take_the_library_rule():
    assert attention.flash_attn_window(100, None, 64) == (-1, -1)
    assert attention.flash_attn_window(5, 70, 64) == (5, -1)
    # the interpreter's launch arguments: (bottom_right, left, right)
    assert attention.mask_args(True, 300, 64, "bottom_right", (63, 9)) == (1, 63, 0)
    assert attention.mask_args(False, 300, 64, "top_left", (64, 9)) == (0, -1, 9)


def test_the_sides_the_structs_carry_keep_the_rule():
    """window_sides saturates flash-attn's sides to the structs' int32 and
    leaves the rule to the library: the rule on what it passes is the rule on
    the sides as given."""
    for left, right, causal, seqlen_k in itertools.product(
            SIDES + [-2**40], SIDES + [-2**40], (False, True), (64, 4096)):
        passed = native.window_sides((left, right))
        assert all(-2**31 <= w < 2**31 for w in passed)
        assert native.attn_window(*passed, causal, seqlen_k) == _flash_attn_rule(
            left, right, causal, seqlen_k), (left, right, causal, seqlen_k)
