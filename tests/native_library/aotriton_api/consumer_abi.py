"""ctypes side of consumer/consumer.cpp (a C++ program calling AOTriton's API
the way PyTorch does): its structs, and cases built from torch tensors of
any device (CPU tensors on the stub driver, CUDA tensors on the GPU)."""

from __future__ import annotations

import ctypes

import torch

# aotriton::DType values
DTYPES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.int32: 12, torch.int64: 13}
TENSORS = ("q", "k", "v", "out", "lse", "bias", "cu_seqlens_q", "cu_seqlens_k", "seed", "offset",
           "encoded_softmax", "dout", "dq", "dk", "dv", "dbias")
MASKS = {None: 0, "bottom_right": 1, "top_left": 2, "window": 3}
ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32)
# hipError_t values
HIP_SUCCESS, HIP_INVALID_VALUE, HIP_INVALID_SYMBOL = 0, 1, 13
HIP_NO_BINARY_FOR_GPU, HIP_NOT_SUPPORTED = 209, 801
ACQUIRED_D, ACQUIRED_DQ_ACC = 1 << 20, 1 << 21


class CTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("sizes", ctypes.c_int64 * 4), ("strides", ctypes.c_int64 * 4)]


class CCase(ctypes.Structure):
    _fields_ = [("mask", ctypes.c_int32), ("window_left", ctypes.c_int32),
                ("window_right", ctypes.c_int32), ("deterministic", ctypes.c_int32),
                ("scale", ctypes.c_float), ("dropout_p", ctypes.c_float),
                ("max_seqlen_q", ctypes.c_int32), ("max_seqlen_k", ctypes.c_int32)] + [
                    (name, CTensor) for name in TENSORS] + [
                ("philox_offset2", ctypes.c_uint64), ("seed_output", CTensor),
                ("offset_output", CTensor), ("varlen_mode", ctypes.c_int32),
                ("lse_th", ctypes.c_int32), ("seq_starts_q", CTensor), ("seq_starts_k", CTensor),
                ("seqused_k", CTensor)]
VARLEN_MODES = {"packed": 0, "seqused_k": 1, "strided": 2, "padded": 3}


def ctensor(t) -> CTensor:
    c = CTensor()
    if t is None:
        return c
    c.data, c.dtype, c.rank = t.data_ptr(), DTYPES[t.dtype], t.dim()
    for i in range(t.dim()):
        c.sizes[i], c.strides[i] = t.shape[i], t.stride(i)
    return c


def make_case(mask=None, window=(-1, -1), scale=0.125, dropout_p=0.0, deterministic=False,
              max_seqlen=(0, 0), philox_offset2=0, varlen_mode="packed", lse_th=False,
              **tensors) -> CCase:
    """``tensors``: TENSORS, seed_output / offset_output (graph capture), and
    for the 0.14 line's varlen modes seq_starts_q / seq_starts_k / seqused_k."""
    c = CCase()
    c.mask, (c.window_left, c.window_right) = MASKS[mask], window
    c.varlen_mode, c.lse_th = VARLEN_MODES[varlen_mode], int(lse_th)
    c.scale, c.dropout_p, c.deterministic = scale, dropout_p, int(deterministic)
    c.max_seqlen_q, c.max_seqlen_k = max_seqlen
    c.philox_offset2 = philox_offset2
    for name, t in tensors.items():
        setattr(c, name, ctensor(t))
    return c


class Consumer:
    """The consumer library; `alloc` hands out zeroed or empty tensors on
    `device` and keeps them alive (the lazy D and DQ_ACC)."""

    def __init__(self, path, device="cpu"):
        self.lib = ctypes.CDLL(str(path))
        self.device = device
        self.allocated = []
        for name in ("consumer_forward", "consumer_forward_version", "consumer_backward",
                     "consumer_check_gpu", "consumer_experimental", "consumer_simulate"):
            getattr(self.lib, name).restype = ctypes.c_int
        self._alloc = ALLOC(self._allocate)

    def _allocate(self, nbytes, zero):
        t = (torch.zeros if zero else torch.empty)(max(nbytes, 16), dtype=torch.uint8,
                                                   device=self.device)
        self.allocated.append(t)
        return t.data_ptr()

    def forward(self, case, stream=None, version=None):
        if version is None:
            return self.lib.consumer_forward(ctypes.byref(case), ctypes.c_void_p(stream))
        return self.lib.consumer_forward_version(ctypes.byref(case), ctypes.c_void_p(stream),
                                                 ctypes.c_int32(version))

    def backward(self, case, stream=None):
        return self.lib.consumer_backward(ctypes.byref(case), ctypes.c_void_p(stream), self._alloc)

    def check_gpu(self, stream=None):
        return self.lib.consumer_check_gpu(ctypes.c_void_p(stream))

    def experimental(self, stream=None):
        return self.lib.consumer_experimental(ctypes.c_void_p(stream))

    def simulate(self, r, dropout_p, seed, offset, stream=None):
        return self.lib.consumer_simulate(ctypes.byref(ctensor(r)), ctypes.c_float(dropout_p),
                                          ctypes.byref(ctensor(seed)), ctypes.byref(ctensor(offset)),
                                          ctypes.c_void_p(stream))

    def kversions(self):
        return self.lib.consumer_fwd_kversion(), self.lib.consumer_bwd_kversion()
