"""Who this process is in the job: rank, node and run id, from the launcher's environment or torch.distributed."""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Identity:
    """The labels stamped on every record and metric of this rank."""

    job: str
    run: str
    node: str
    rank: int
    local_rank: int
    world_size: int
    pid: int
    node_rank: int = 0

    def labels(self) -> dict:
        """Return the identity as a dict of column values (what every record row starts with)."""
        d = asdict(self)
        d.pop("node_rank")
        return d


def _int_env(*names: str):
    for name in names:
        value = os.environ.get(name, "")
        if value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def live_process_group():
    """torch.distributed if torch is already imported and a process group is up, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception:
        return None
    return None


def is_settled() -> bool:
    """True once rank and world size are known for sure (launcher variables or a live process group)."""
    return _int_env("RANK", "SLURM_PROCID") is not None or live_process_group() is not None


def _process_start(pid: int) -> float:
    """Start time of a process as Unix seconds (Linux /proc), or now when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except Exception:
        return time.time()


_RUN_ID_OK = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def check_run_id(run_id: str) -> str:
    """A run id names a folder under ``run_dir``: letters, digits and ``-_.``, no leading dot, at most 200
    characters. Anything else (``../x``, an absolute path, glob characters) is refused here, at ``init``."""
    if not isinstance(run_id, str) or not _RUN_ID_OK.match(run_id):
        raise ValueError(
            f"ranksight: run_id {run_id!r} must be 1-200 letters, digits, '-', '_' or '.', not starting with a dot"
        )
    return run_id


def safe_name(text: str) -> str:
    """``text`` with every character a run id may not hold replaced by '-' (for derived ids)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", text).lstrip(".") or "run"
    return cleaned[:200]


def derive_run_id(world_size: int, job: str = "default") -> str:
    """Pick a run id that every rank of one launch derives alike, without talking to the others:
    ``<job>-<YYYYmmdd-HHMMSS>-<short>``, readable and sortable by start time.

    - SLURM: the job's start time (``SLURM_JOB_START_TIME``) and ``slurm<job id>[.<step>]``; without that
      variable (older Slurm) ``<job>-slurm<job id>[.<step>]``.
    - torchrun ``--standalone`` (a random rendezvous UUID): the start of the launcher the local ranks share
      and the UUID's first 6 characters.
    - torchrun with a rendezvous id you chose (multi-node): ``<job>-<rdzv id>`` — nodes share no clock.
    - several ranks on one node otherwise (torch.multiprocessing): the shared launcher's start and pid;
      a single process: its own.
    """
    env = os.environ
    job = safe_name(job)
    if env.get("SLURM_JOB_ID"):
        step = env.get("SLURM_STEP_ID")
        short = f"slurm{env['SLURM_JOB_ID']}" + (f".{step}" if step else "")
        start = env.get("SLURM_JOB_START_TIME", "")
        if start.isdigit():
            return safe_name(f"{job}-{_stamp(int(start))}-{short}")
        return safe_name(f"{job}-{short}")
    rdzv = env.get("TORCHELASTIC_RUN_ID", "")
    rdzv = "" if rdzv == "none" else rdzv
    if rdzv and not _UUID.match(rdzv):
        return safe_name(f"{job}-{rdzv}")
    pid = os.getppid() if world_size > 1 or rdzv else os.getpid()  # torchrun: its agent is the launcher
    short = rdzv[:6] if rdzv else str(pid)
    return safe_name(f"{job}-{_stamp(_process_start(pid))}-{short}")


def _stamp(unix_s: float) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(unix_s))


def resolve(job: str, run_id: str | None) -> Identity:
    """Read the identity now: launcher variables first, then a live process group, else a single process."""
    env = os.environ
    dist = live_process_group()
    rank = _int_env("RANK", "SLURM_PROCID")
    world = _int_env("WORLD_SIZE", "SLURM_NTASKS")
    if rank is None and dist is not None:
        rank, world = dist.get_rank(), dist.get_world_size()
    if world is None and dist is not None:
        world = dist.get_world_size()
    rank = rank if rank is not None else 0
    world = world if world is not None else 1
    local_rank = _int_env("LOCAL_RANK", "SLURM_LOCALID")
    if local_rank is None:
        local_ws = _int_env("LOCAL_WORLD_SIZE")
        local_rank = rank % local_ws if local_ws else (rank if world > 1 and "SLURM_NODEID" not in env else 0)
    node_rank = _int_env("GROUP_RANK", "SLURM_NODEID") or 0
    node = env.get("RANKSIGHT_NODE") or socket.gethostname() or f"node{node_rank}"
    return Identity(
        job=job,
        run=run_id or derive_run_id(world, job),
        node=node,
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        pid=os.getpid(),
        node_rank=node_rank,
    )


class IdentityHolder:
    """This rank's identity, fixed once the launcher or the process group says it for sure.

    Before ``torch.distributed`` is initialised a rank may not know who it is (a plain
    ``python train.py`` that calls ``init_process_group`` later): the agent thread asks again at each
    flush, and writes nothing under a guessed identity unless it must (steps recorded, or closing).
    """

    def __init__(self, job: str, run_id: str | None) -> None:
        self._job = job
        self._run_id = run_id
        self._identity: Identity | None = None
        self.settled = False

    def settle(self, force: bool = False) -> bool:
        """Resolve the identity if it is known for sure (or ``force``); True once it is final."""
        if self.settled:
            return True
        sure = is_settled()
        if sure or force:
            self._identity = resolve(self._job, self._run_id)
            self.settled = sure or force
        return self.settled

    def get(self) -> Identity:
        """The identity now (resolved on first use; final once :meth:`settle` says so)."""
        if self._identity is None or not self.settled:
            sure = is_settled()
            self._identity = resolve(self._job, self._run_id)
            self.settled = sure
        return self._identity
