"""Attach the monitor to a model and optimizer: a forward pre-hook, optimizer step hooks, timing of every
``torch.distributed`` collective (``_collectives``), and the timing of DDP's gradient all-reduce.

DDP's all-reduce is timed per step, not per bucket, by default: one post-accumulate-grad hook queues an
autograd final callback at the end of backward (backward's end: the exposed all-reduce starts) which queues
a second one that runs after DDP's own finalisation has waited for every bucket (the all-reduce done). On
gloo these are host clocks (``_time_grad_sync``); on NCCL, whose host futures complete at enqueue, CUDA
events (``_gpu_hooks``). A Python comm hook per bucket (``Config(comm_hook=True)``, gloo only) adds per-bucket
rows at a price: it runs PyTorch's Python ``allreduce_hook`` instead of DDP's C++ path (0.8 ms of training-
thread CPU a step on a 2-rank gloo job, ``benchmarks/results/cpu_agent_cost_gloo_arms.json``), and each
bucket's done callback runs on gloo's communication thread, where it must take the GIL the training thread
holds.

All hooks run on the training (or autograd / communication) threads, so each one is a clock read and
a ``deque.append``; errors inside them are caught, counted, and switch the hook off.
"""

from __future__ import annotations

import sys
from typing import Any

from ._events import EV_BUCKET_DONE, EV_BUCKET_READY, EV_GRAD_SYNC, EV_INFO
from ._protocol import MonitorLike


def _unwrap(model: Any) -> tuple[Any, Any, Any]:
    """Return (outermost module to hook, the DDP wrapper if any, the innermost module) through
    torch.compile wrappers."""
    torch = sys.modules["torch"]
    ddp_cls = torch.nn.parallel.DistributedDataParallel
    ddp = None
    inner = model
    for _ in range(4):  # compiled(DDP(model)) or DDP(compiled(model)): a few layers at most
        if isinstance(inner, ddp_cls):
            ddp = inner
            inner = inner.module
        elif hasattr(inner, "_orig_mod"):
            inner = inner._orig_mod
        else:
            break
    return model, ddp, inner


def _fsdp_units(module: Any) -> int:
    """How many modules FSDP2 (``fully_shard``) manages in this model; 0 when it is not FSDP2."""
    from ._fsdp_hooks import fsdp_modules

    return len(fsdp_modules(module))


def _attach_fsdp(m: MonitorLike, module: Any) -> str:
    """Record the FSDP2 units' facts and wrap their collectives (``_fsdp_hooks``); return what watch() says."""
    from ._fsdp_hooks import attach_fsdp, fsdp_facts

    facts: dict = {}
    try:
        facts = fsdp_facts(module)
    except Exception as exc:
        m._warn_once("fsdp_facts", f"cannot describe the FSDP2 units ({exc})")
        facts = {"units": _fsdp_units(module)}
    m._append((EV_INFO, "fsdp", facts))
    recorder = None
    try:
        recorder = attach_fsdp(m, module)
    except Exception as exc:
        m._fail("fsdp_hooks", exc)
    if recorder is not None:
        m._closers.append(recorder)
    units, with_params = facts.get("units", 0), facts.get("units_with_params")
    what = (
        "each unit's all-gathers (forward, backward, exposed vs overlapped) and reduce-scatters timed"
        if recorder is not None
        else "all-gathers and reduce-scatters timed as collectives (no per-unit split on this torch)"
    )
    detail = f"{units} fully_shard units"
    if with_params is not None:
        detail += (
            f", {with_params} with parameters, reshard_after_forward on {facts.get('reshard_after_forward_units')}, "
            f"explicit forward prefetch on {facts.get('forward_prefetch_units')}"
        )
    return f"({detail}): {what}"


def _check_torch_version(m: MonitorLike, version: str) -> None:
    """Warn once on a torch older than the 2.4 the agent is tested against; keep going."""
    try:
        major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    except ValueError:
        m._warn_once("torch_version", f"cannot parse torch version {version!r}; measuring anyway")
        return
    if (major, minor) < (2, 4):
        m._warn_once("torch_version", f"torch {version} is older than 2.4: some signals may be missing")


def _model_facts(model: Any) -> dict:
    """Parameter count, bytes and devices: small facts the rules use (e.g. memory per rank)."""
    params = list(model.parameters())
    devices = sorted({str(p.device) for p in params})
    return {
        "parameters": sum(p.numel() for p in params),
        "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "devices": devices,
        "class": type(model).__name__,
    }


def attach_model(m: MonitorLike, model: Any) -> None:
    """Hook the model's forward start, and DDP's all-reduce when the model is DDP-wrapped."""
    import torch  # the user's torch, imported only now

    _check_torch_version(m, torch.__version__)
    outer, ddp, inner = _unwrap(model)
    clock = m._clock
    is_compiling = m._is_compiling

    def on_forward(module, args):
        # Only the first forward of a step counts (gradient accumulation runs several).
        try:
            if m._in_step and m._fwd_ns == 0 and not is_compiling():
                m._fwd_ns = clock()
        except Exception as exc:
            m._fail("forward_hook", exc)

    m._hook_handles.append(outer.register_forward_pre_hook(on_forward))
    m._append((EV_INFO, "model", _model_facts(outer)))

    m._time_collectives()
    fsdp_units = _fsdp_units(inner)
    fsdp_note = ""
    if ddp is not None:
        parallelism = "ddp"
    elif fsdp_units:
        parallelism = "fsdp2"
        fsdp_note = _attach_fsdp(m, inner)
    else:
        parallelism = "none"
    m._append((EV_INFO, "parallelism", parallelism))

    host_hook = False
    if ddp is not None:
        facts = _ddp_config(ddp)
        host_hook = m.config.comm_hook and facts["backend"] != "nccl"
        facts["comm_hook"] = host_hook
        facts["grad_bytes"] = sum(p.numel() * p.element_size() for p in ddp.parameters() if p.requires_grad)
        if hasattr(ddp, "_get_ddp_logging_data"):
            m._ddp_stats = ddp._get_ddp_logging_data
            try:
                facts["buckets"] = ddp_bucket_count(ddp._get_ddp_logging_data())
            except Exception:
                facts["buckets"] = None
        m._append((EV_INFO, "ddp", facts))
        if host_hook:
            _register_comm_hook(m, ddp)
        elif facts["backend"] != "nccl":
            _time_grad_sync(m, ddp)
    # Says what watch() attached to, so a user (and the dashboard's event list) can check it saw the job right.
    m._reporter.info(
        "watch",
        {"ddp": f"DDP: {'per-bucket' if host_hook else 'exposed'} all-reduce and every other collective timed",
         "fsdp2": f"FSDP2 {fsdp_note}",
         "none": "a module without DDP or FSDP2: collectives in user code timed"}[parallelism],
    )  # fmt: skip

    if torch.cuda.is_available():
        try:
            from ._gpu_hooks import attach_gpu  # optional: GPU signals live in their own module

            attach_gpu(m, outer, backward_hook=ddp is not None and not host_hook)
        except ImportError:
            pass
        except Exception as exc:
            m._fail("gpu", exc)


def _ddp_config(ddp: Any) -> dict:
    """DDP's settings that the diagnosis rules look at."""
    return {
        "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
        "bucket_cap_bytes": int(getattr(ddp, "bucket_bytes_cap", 0) or 0),
        "static_graph": bool(getattr(ddp, "static_graph", False)),
        "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
        "broadcast_buffers": bool(getattr(ddp, "broadcast_buffers", False)),
        "backend": _backend_name(ddp),
    }


def _backend_name(ddp: Any) -> str:
    try:
        import torch.distributed as dist

        return str(dist.get_backend(ddp.process_group))
    except Exception:
        return "unknown"


def ddp_bucket_count(logging_data: dict) -> int | None:
    """How many gradient buckets DDP all-reduces a step, from its logging data (``_get_ddp_logging_data()``):
    the rebuilt layout once DDP has rebuilt its buckets (after its first steps), else the first one."""
    sizes = logging_data.get("rebuilt_bucket_sizes") or logging_data.get("bucket_sizes")
    return len(str(sizes).split(",")) if sizes else None


def _time_grad_sync(m: MonitorLike, ddp: Any) -> None:
    """Time DDP's gradient sync on the host clock, once per step and without a per-bucket hook.

    The gradient computed last is the first trainable parameter's (the layers nearest the input finish
    backward last): its post-accumulate-grad hook marks the end of backward (as ``_gpu_hooks`` does on NCCL;
    read there, not later, so the mark does not wait behind gloo's threads for a core) and queues ``after_ddp``.
    DDP queues its finalisation, which waits for every bucket's all-reduce and copies the results into the
    gradients, when its last bucket becomes ready, after this hook ran; callbacks queued while final
    callbacks run go to the end, so ``done``, queued by ``after_ddp``, runs after that wait. All three run on
    the thread that ran backward: no callback on gloo's communication thread. A backward under ``no_sync()``
    is not marked.
    """
    import torch

    param = next((p for p in ddp.parameters() if p.requires_grad), None)
    if param is None or not hasattr(param, "register_post_accumulate_grad_hook"):
        m._warn_once("grad_sync", "cannot mark the end of backward (torch < 2.1?): exposed all-reduce is not measured")
        return
    queue = torch.autograd.Variable._execution_engine.queue_callback
    clock, append, is_compiling = m._clock, m._append, m._is_compiling
    ready_ns = [0]

    def done():
        try:
            if m._in_step:
                append((EV_GRAD_SYNC, m._step, ready_ns[0], clock()))
        except Exception as exc:
            m._fail("grad_sync", exc)

    def after_ddp():
        try:
            queue(done)
        except Exception as exc:
            m._fail("grad_sync", exc)

    def on_grad(tensor):
        try:
            if m._in_step and ddp.require_backward_grad_sync and not is_compiling():
                ready_ns[0] = clock()
                queue(after_ddp)
        except Exception as exc:
            m._fail("grad_sync", exc)

    m._hook_handles.append(param.register_post_accumulate_grad_hook(on_grad))


def _register_comm_hook(m: MonitorLike, ddp: Any) -> None:
    """Wrap DDP's default all-reduce so each bucket's ready and done times are recorded.

    Done callbacks run on the communication thread and can complete out of order, so every mark
    carries (step, bucket index). The values DDP sees are exactly the default hook's.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from ._collectives import untimed

    clock = m._clock
    append = m._append
    count = m._reporter.count
    no_timing = untimed()

    def done_mark(step: int, index: int, is_last: bool):
        def on_done(fut):
            try:
                append((EV_BUCKET_DONE, step, index, clock()))
                gpu = m._gpu
                if is_last and gpu is not None:  # GPU-time mark of the last all-reduce's completion
                    gpu.bucket_done(step)
            except Exception as exc:  # one lost completion mark: counted, the all-reduce goes on
                count("comm_hook_done", exc)
            return fut.value()

        return on_done

    def timed_allreduce(process_group, bucket):
        step, index, is_last = m._step, -1, False
        try:
            index = bucket.index()
            is_last = bucket.is_last()
            # Read every time: DDP rebuilds its buckets after the first iteration, so an index's size changes.
            buf = bucket.buffer()
            append((EV_BUCKET_READY, step, index, buf.numel() * buf.element_size(), clock(), is_last))
            if m._gpu is not None:  # GPU-time mark of the last bucket (agent/_gpu_hooks.py)
                m._gpu.bucket_ready(step, is_last)
        except Exception as exc:
            m._fail("comm_hook", exc)
        with no_timing:  # the bucket marks time this all-reduce; the collective timer must not count it too
            fut = allreduce_hook(process_group, bucket)
        if index < 0:
            return fut
        return fut.then(done_mark(step, index, is_last))

    try:
        ddp.register_comm_hook(state=ddp.process_group, hook=timed_allreduce)
    except Exception as exc:
        # Typically: the user registered their own hook (DDP allows one). Degrade, don't fail.
        m._warn_once("comm_hook", f"per-bucket all-reduce timing is off: could not register a comm hook ({exc})")


# Optimizer state kept per parameter element, in parameter-sized tensors (what ZeRO calls K / param size):
# Adam-family keeps two moments, momentum / RMS methods one.
# Unknown classes (LBFGS's history, Adafactor's factored moments, third-party optimizers) give None.
_STATES_PER_PARAM = {
    "Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2, "Adadelta": 2, "Rprop": 2,
    "RMSprop": 1, "Adagrad": 1, "ASGD": 1,
}  # fmt: skip


def _optimizer_facts(optimizer: Any) -> dict:
    name = type(optimizer).__name__
    states = _STATES_PER_PARAM.get(name)
    if name == "SGD":
        states = int(any(g.get("momentum", 0) for g in getattr(optimizer, "param_groups", [])))
    return {"class": name, "states_per_param": states}


def attach_optimizer(m: MonitorLike, optimizer: Any) -> None:
    """Time ``optimizer.step()`` with the optimizer's own pre/post step hooks (torch >= 2.0); record
    what state it keeps per parameter (for the model-state memory rule)."""
    try:
        m._append((EV_INFO, "optimizer", _optimizer_facts(optimizer)))
    except Exception as exc:
        m._warn_once("optimizer_facts", f"cannot describe the optimizer ({exc})")
    begin, end = m.optimizer_begin, m.optimizer_end

    def pre(opt, args, kwargs):
        begin()

    def post(opt, args, kwargs):
        end()

    if not hasattr(optimizer, "register_step_pre_hook"):
        m._warn_once("optimizer", "optimizer has no step hooks (torch < 2.0?): optimizer time is not measured")
        return
    m._hook_handles.append(optimizer.register_step_pre_hook(pre))
    m._hook_handles.append(optimizer.register_step_post_hook(post))
