"""Triton's CPU interpreter as released with torch 2.9-2.11 (triton <= 3.6)
turns a scalar into a loop bound with ``int(handle.data)``. Its scalars are
1-element arrays, and numpy >= 2.5 refuses ``int()`` of an array that is not
0-dimensional, so every ``range(lo, hi)`` over computed bounds fails. Later
triton squeezes first; this does the same for the older ones."""

from __future__ import annotations

_applied = False


def fix_scalar_index() -> None:
    """Make ``tl.tensor.__index__`` squeeze inside interpreted kernels."""
    global _applied
    if _applied:
        return
    _applied = True
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None:
        return

    def patch_then_squeeze(tensor, scope, *rest, **kwargs):
        patch(tensor, scope, *rest, **kwargs)
        # scope.restore() undoes its changes last-in first-out: this one first
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patch_then_squeeze
