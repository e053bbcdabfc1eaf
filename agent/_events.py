"""The raw events the hot path appends to the monitor's deque, and their tuple layouts.

This module is at the bottom of the agent: everything may import it, it imports nothing. Events
are plain tuples (no allocation beyond the tuple itself on the training thread); the agent thread
decodes them by their first element.
"""

from __future__ import annotations

EV_STEP = "S"
"""(tag, step, begin_ns, end_ns, fetch_begin_ns, fetch_end_ns, fwd_ns, opt_begin_ns, opt_end_ns, data_ns,
pre_data_ns, pre_data_begin_ns, data_in_compute_ns, cpu_ns)

``fetch_*`` is the wrapped loader's wait for this step's batch (0 when none). ``data_ns`` is the time
inside ``mon.data()`` blocks while the step was open (-1 when the rank has measured no input at all:
no loader, no marks); ``pre_data_ns`` the time inside such blocks since the previous step closed, and
``pre_data_begin_ns`` when the first of those began (0 if none), so the step's wall time starts there;
``data_in_compute_ns`` the part of ``data_ns`` spent between the first forward and the optimizer (a
prefetch there is data, not compute); ``cpu_ns`` the training thread's CPU time over the step (its
thread CPU clock: a rank slowed by a busy host uses no more of it, a rank with more work does)."""

EV_BUCKET_READY = "B"
"""(tag, step, bucket, bytes, ready_ns, is_last): a DDP gradient bucket handed to the comm hook."""

EV_BUCKET_DONE = "D"
"""(tag, step, bucket, done_ns): that bucket's all-reduce future completed (communication thread)."""

EV_GRAD_SYNC = "Y"
"""(tag, step, ready_ns, done_ns): DDP's gradient sync without the per-bucket hook (gloo's default): backward's
end, before DDP waits for its buckets, and the moment that wait returned; two autograd final callbacks on the
thread that ran backward. The step's last synced backward wins (gradient accumulation)."""

EV_COLLECTIVE = "C"
"""(tag, step, op, origin, group, bytes, begin_ns, end_ns, blocked_ns[, wall_begin_ns]): one torch.distributed
collective or barrier issued outside DDP's gradient buckets. ``end_ns`` is when the calling thread was
released (for an async op, when its ``wait()`` returned); ``blocked_ns`` is how long the caller was held in
all; ``wall_begin_ns`` (Unix ns, optional: FSDP2's own rows lack it) matches the call to NCCL's flight
recorder entries, which carry that clock."""

EV_INFO = "I"
"""(tag, name, payload): rare structured facts (DDP config, model size, loader settings, warnings)."""

EV_GPU = "G"
"""(tag, step, payload): GPU-side marks (CUDA events), resolved later by the GPU resolver."""

STEP_MARKS = (EV_STEP,)
"""Kinds appended by the training thread alone, so the producer's count needs no lock (drop accounting)."""
