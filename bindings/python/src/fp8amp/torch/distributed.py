"""The PyTorch front's data-parallel side: fp8amp's communicator over a torch.distributed group,
``all_reduce_grads`` and DDP's FP8 communication hook ``fp8_comm_hook``."""
from __future__ import annotations

import weakref
from typing import Any, Dict, List, Tuple

import torch
from torch import nn

import fp8amp
from fp8amp._ffi import lib
from fp8amp.torch.context import _norm_device, _on_current_stream, context, to_fp8amp
from fp8amp.torch.linear import Linear


_COMMS: Dict[Tuple[str, int], fp8amp.Communicator] = {}


def communicator(device: Any, group: Any = None) -> fp8amp.Communicator:
    """fp8amp's communicator (FP8 on the wire, docs/communicator.md) over the ranks of torch.distributed's
    `group` (the default group when None) on a CUDA `device`: made on first use -- collectively: every
    rank of the group must ask for it the first time -- with its NCCL id broadcast through the group,
    then cached for that device and group. Rank r of the group is rank r of the communicator."""
    import torch.distributed as dist

    d = _norm_device(device)
    if d.type != "cuda":
        raise fp8amp.NotSupportedError(int(lib.FP8AMP_ERROR_NOT_SUPPORTED),
            "fp8amp.torch.communicator: %s is not a CUDA device; the CPU communicator runs over MPI "
            "(processes started by mpirun), not over torch.distributed's processes" % d)
    key = (str(d), id(group))
    comm = _COMMS.get(key)
    if comm is None or comm.closed:
        ctx = context(d)
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        box = [fp8amp.Communicator.unique_id(ctx) if rank == 0 else None]
        src = 0 if group is None else dist.get_global_rank(group, 0)
        dist.broadcast_object_list(box, src=src, group=group)
        comm = fp8amp.Communicator(ctx, box[0], world, rank)
        comm._group = group  # type: ignore[attr-defined]  # keeps the key's id(group) from being reused
        _COMMS[key] = comm
    return comm


def all_reduce_grads(model: nn.Module, group: Any = None, *, fp8_wire: bool = True) -> None:
    """Averages every gradient of `model` over torch.distributed's `group` (the default group when
    None). Call after backward, before step, on every rank.

    On CUDA with ``fp8_wire`` (the default), the E4M3 weight gradients of the fp8amp.torch.Linear
    layers go in one bucket through fp8amp's communicator (FP8 on the wire, FP32 accumulation in rank
    order, one agreed scale per tensor; every rank gets identical bytes; docs/communicator.md), in
    place: each keeps its codes' new scale_inv. The other gradients (biases, norms, embeddings,
    BF16/F32 weight gradients) keep their dtype and go through torch.distributed, coalesced into one
    all_reduce per dtype and device. Without ``fp8_wire``, or on the CPU, the E4M3 weight gradients are
    dequantized to float32, all-reduced through torch.distributed and quantized back."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    seen = set()
    buckets: Dict[str, List[Tuple[Linear, fp8amp.Tensor]]] = {}
    for mod in model.modules():
        if isinstance(mod, Linear) and mod._lin.weight_grad.dtype == fp8amp.E4M3:
            seen.add(id(mod.weight))
            if fp8_wire and mod._device.type == "cuda":
                buckets.setdefault(str(mod._device), []).append((mod, mod._lin.weight_grad))
                continue
            g = mod.dequantized_weight_grad()
            dist.all_reduce(g, group=group)
            g.div_(world)
            _on_current_stream(mod._ctx, mod._device)
            # same stream as the reduction's consumer; g's memory is reused only after this kernel
            fp8amp.quantize(mod._ctx, to_fp8amp(g, mod._ctx), mod._lin.weight_grad)
    for dev, items in buckets.items():
        comm = communicator(dev, group)
        _on_current_stream(comm.context, _norm_device(dev))
        grads = [g for _, g in items]
        comm.all_reduce(grads, grads)
    # The rest in its own dtype: one flat buffer per (device, dtype), so one collective each.
    rest: Dict[Tuple[str, torch.dtype], List[torch.Tensor]] = {}
    for p in model.parameters():
        if id(p) in seen or p.grad is None:
            continue
        rest.setdefault((str(p.grad.device), p.grad.dtype), []).append(p.grad)
    for grads in rest.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


# Unannotated on purpose: DDP checks a hook's annotations against dist.GradBucket and
# torch.futures.Future[torch.Tensor], and this module's annotations are strings (from __future__).
def fp8_comm_hook(state, bucket):  # type: ignore[no-untyped-def]
    """A communication hook for ``torch.nn.parallel.DistributedDataParallel`` that averages each
    gradient bucket through fp8amp's communicator: FP8 (E4M3) on the wire, float32 accumulation in a
    fixed rank order, one agreed scale per parameter, identical bytes on every rank
    (docs/communicator.md, docs/torch.md section 6)::

        ddp = DistributedDataParallel(model, device_ids=[rank])
        ddp.register_comm_hook(None, fp8amp.torch.fp8_comm_hook)   # state: the group, None = default

    `state` is the torch.distributed process group to reduce over (None: the default group). The
    bucket (float32, or bfloat16/float16 for such parameters) is reduced in place; each parameter's
    slice of it gets its own scale. Each bucket layout's first all-reduce checks the arguments across
    the ranks; later ones with the same layout skip the check (DDP keeps the ranks' buckets alike), so
    that the hook does not make the host wait for the device. CUDA only (the communicator's GPU backend is NCCL, made on first
    use over the group: every rank's first bucket makes it). On CPU buckets it raises
    NotSupportedError: fp8amp's CPU communicator runs over MPI (processes started by mpirun), not over
    torch.distributed's gloo processes; use DDP's default all-reduce there."""
    import torch.distributed as dist

    buf = bucket.buffer()
    if buf.device.type != "cuda":
        raise fp8amp.NotSupportedError(int(lib.FP8AMP_ERROR_NOT_SUPPORTED),
            "fp8amp.torch.fp8_comm_hook: the gradient bucket is on %s; fp8amp's communicator runs on CUDA "
            "devices (NCCL) or, on the CPU, over MPI in processes started by mpirun, not over torch.distributed's "
            "gloo processes: use DDP's default all-reduce for CPU models" % buf.device)
    if state is not None and not isinstance(state, dist.ProcessGroup):
        raise TypeError("fp8amp.torch.fp8_comm_hook: state must be a torch.distributed ProcessGroup or None (the "
                        "default group), not %s" % type(state).__name__)
    dev = _norm_device(buf.device)
    comm = communicator(dev, state)
    _on_current_stream(comm.context, dev)
    # The bucket holds its parameters' gradients end to end (dense DDP buckets): one slice (and so one
    # scale) per parameter; should the layout ever differ, the whole bucket with one scale.
    views, off = [], 0
    for p in bucket.parameters():
        views.append(buf[off:off + p.numel()])
        off += p.numel()
    if off != buf.numel():
        views = [buf]
    ts = [to_fp8amp(v, comm.context) for v in views]
    # The communicator's cross-rank argument check makes the host wait for the device (for everything
    # enqueued before the bucket's all-reduce, docs/communicator.md "Bad input"). DDP gives every rank
    # the same buckets (it checks the parameters' shapes across ranks when it is made and takes rank
    # 0's bucket order when it rebuilds them after the first step), so each bucket layout is checked
    # once -- its first all-reduce -- and then reduced with check = 0: in the steady state the hook
    # never waits on the host.
    layout = (bucket.index(), buf.dtype, tuple(v.numel() for v in views))
    checked = comm.__dict__.setdefault("_checked_bucket_layouts", set())
    comm.all_reduce(ts, ts, check_args=layout not in checked)
    checked.add(layout)
    fut = torch.futures.Future(devices=[dev])
    fut.set_result(buf)
    return fut


def data_parallel(model: nn.Module, **ddp_kwargs: Any) -> nn.parallel.DistributedDataParallel:
    """``torch.nn.parallel.DistributedDataParallel(model, **ddp_kwargs)``, at O3 too. At O1/O2 it is
    stock DDP. At O3 the E4M3 Linear weights (and their weight_scale_inv buffers) are left out of DDP
    (``_set_params_and_buffers_to_ignore_for_model``: DDP would bucket their gradients in float8,
    which no collective reduces) and this function's post-accumulate-grad hook reduces each one
    instead, at every backward that DDP synchronizes (not under ``no_sync()``): the gradient's values
    (its E4M3 codes dequantized) all-reduced in float32 over DDP's process group and averaged, then
    written back into the codes with current scaling -- what DDP's bucket does for an O2 weight, one
    blocking all-reduce per weight. Every rank must start from the same E4M3 weights (the same seed
    and initialize; DDP's initial broadcast skips them). docs/torch.md section 6."""
    import torch.distributed as dist

    ignore, e4m3 = [], []
    for name, m in model.named_modules():
        if isinstance(m, Linear) and m._e4m3 and m._parameters["weight"] is m._st.weight:
            prefix = name + "." if name else ""
            ignore += [prefix + "weight", prefix + "weight_scale_inv"]
            e4m3.append(m.weight)
    if not e4m3:
        return nn.parallel.DistributedDataParallel(model, **ddp_kwargs)
    old = getattr(model, "_ddp_params_and_buffers_to_ignore", None) or []
    nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, list(old) + ignore)
    ddp = nn.parallel.DistributedDataParallel(model, **ddp_kwargs)
    group = ddp_kwargs.get("process_group")
    world = dist.get_world_size(group)
    dref = weakref.ref(ddp)  # the hooks live on the weights, which DDP holds: no cycle

    def reduce(p: torch.Tensor) -> None:
        d = dref()
        if d is None or not d.require_backward_grad_sync or p.grad is None:
            return
        v = p.grad.float()  # a new float32 tensor: the dequantized codes
        dist.all_reduce(v, group=group)
        v.div_(world)
        with torch.no_grad():
            p.grad.copy_(v)  # quantized back into the codes (LinearGrad's copy_)

    for w in e4m3:
        w.register_post_accumulate_grad_hook(reduce)
    return ddp
