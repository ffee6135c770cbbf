"""Layer 1 of the runtime: the attention itself. The device, the native
library (ctypes), the backends that launch kernels (the AOT archives or the
CPU interpreter), attention and KV-cache launchers, dropout masks, Philox
state, the kernel spec the interpreter reads, and torch's registry."""
