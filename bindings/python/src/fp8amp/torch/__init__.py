"""The PyTorch front of fp8amp: ``Linear`` (an nn.Module on fp8amp's FP8 Linear), ``initialize``
(MS-AMP's ``msamp.initialize`` shape: swaps nn.Linear layers, wraps Adam/AdamW), ``all_reduce_grads``
and ``GradScaler``. Importing ``fp8amp`` never imports this module; importing this module patches
nothing (no global monkeypatching): only the model and optimizer given to ``initialize`` change.

    import fp8amp.torch as ft
    model, opt = ft.initialize(model, torch.optim.AdamW(model.parameters(), lr=3e-4), opt_level="O2")
    for batch in data:
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(batch)
        loss.backward()
        opt.step()
        opt.zero_grad()

See bindings/python/README.md ("PyTorch front") for how memory, streams, gradients and checkpoints
are shared between the two libraries.
"""
from __future__ import annotations

__all__ = ["Linear", "LinearGrad", "initialize", "Config", "Optimizer", "GradScaler", "all_reduce_grads",
           "communicator", "fp8_comm_hook", "data_parallel", "context", "to_fp8amp", "LayerNorm", "LayerNormLinear",
           "LayerNormMLP", "GELU", "RMSNorm", "SiLU", "SwiGLU"]

# The package: context.py (contexts, dtype maps, tensor helpers), linear.py (the Linear module and its
# autograd path), optim.py (the optimizer), amp.py (initialize, GradScaler), distributed.py (communicator,
# all_reduce_grads, the DDP hook), fused.py (fused norm/activation blocks). Their public names are
# re-exported here, so fp8amp.torch.X is the one spelling users need.
from fp8amp.torch.context import (_CONTEXTS, _DT, _TORCH_DT, _from_fp8amp, _norm_device,  # noqa: F401
                                  _on_current_stream, _raw_stream, _torch_alloc, _torch_free, _wrap, context,
                                  to_fp8amp)
from fp8amp.torch.linear import Linear, LinearGrad, _autocast_dtype, _replace_linears  # noqa: F401
from fp8amp.torch.optim import Optimizer  # noqa: F401
from fp8amp.torch.distributed import all_reduce_grads, communicator, data_parallel, fp8_comm_hook  # noqa: F401
from fp8amp.torch.amp import Config, GradScaler, initialize  # noqa: F401
from fp8amp.torch.fused import GELU, LayerNorm, LayerNormLinear, LayerNormMLP, RMSNorm, SiLU, SwiGLU  # noqa: F401
