"""flash-attn's module name (``flash_attn.flash_attn_interface``), kept as
``aotriton_rocm.flash_attn_interface``: the module is
:mod:`aotriton_rocm.integrations.flash_attn_interface`."""
import sys

from .integrations import flash_attn_interface

sys.modules[__name__] = flash_attn_interface
