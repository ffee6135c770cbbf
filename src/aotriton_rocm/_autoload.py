"""torch's backend autoload hook (entry point group ``torch.backends``).

Runs at the end of ``import torch``. It must never raise (an exception here
aborts ``import torch``) and must not activate anything unless asked:
``AOTRITON_ROCM_ENABLE=1`` opts in.
"""

import os
import warnings


def autoload() -> None:
    try:
        import aotriton_rocm

        if os.environ.get("AOTRITON_ROCM_ENABLE", "") == "1":
            aotriton_rocm.enable()
    except Exception as exc:  # noqa: BLE001 - must not break `import torch`
        warnings.warn(f"aotriton-rocm: autoload failed, torch's own kernels stay in use: {exc}")
