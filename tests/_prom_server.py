"""Test helpers: a real Prometheus server on loopback, and a 2-rank job that holds its endpoints open.

The server loads ``compose/prometheus.yml`` -- the file docker-compose uses -- with only the scrape
and refresh intervals shortened (and the collector's static target left out), from a temporary
folder that holds the run root as ``ranksight-runs/`` (the file's relative ``file_sd`` path).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPOSE_PROMETHEUS_YML = os.path.join(ROOT, "compose", "prometheus.yml")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusServer:
    """``/usr/bin/prometheus`` with its own config and data folder, bound to 127.0.0.1."""

    def __init__(self, workdir: str, scrape_interval: str = "1s") -> None:
        self.workdir = workdir
        self.runs_dir = os.path.join(workdir, "ranksight-runs")
        os.makedirs(self.runs_dir, exist_ok=True)
        with open(COMPOSE_PROMETHEUS_YML) as f:
            config = yaml.safe_load(f)
        config["global"]["scrape_interval"] = scrape_interval
        config["global"]["scrape_timeout"] = scrape_interval
        config["scrape_configs"] = [c for c in config["scrape_configs"] if c["job_name"] == "ranksight"]
        for sd in config["scrape_configs"][0]["file_sd_configs"]:
            sd["refresh_interval"] = "1s"
        self.config_path = os.path.join(workdir, "prometheus.yml")
        with open(self.config_path, "w") as f:
            yaml.safe_dump(config, f)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(workdir, "prometheus.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [
                shutil.which("prometheus") or "/usr/bin/prometheus",
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={os.path.join(workdir, 'data')}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
        self._wait_ready(60)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready after {timeout_s} s: {self.log()}")

    def targets(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=5) as r:
            return json.load(r)["data"]["activeTargets"]

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-3000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()


def held_rank_main(rank: int, run_dir: str, run_id: str, out_dir: str, steps: int, master_port: int) -> None:
    """One rank of a 2-node job (one rank per simulated node): train, then keep the endpoint up.

    Each rank is local rank 0 of its own "node" (``RANKSIGHT_NODE``), with a free port (base 0), so
    both serve on loopback as two nodes would on their own hosts. After ``steps`` steps the rank
    writes ``trained-<rank>`` and waits for ``release`` before closing (the endpoint goes with it).
    """
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        LOCAL_RANK="0",
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="1",
        GROUP_RANK=str(rank),
        RANKSIGHT_RUN_ID=run_id,
        RANKSIGHT_NODE=f"node{rank}",
        RANKSIGHT_PROMETHEUS_PORT="0",
    )
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ranksight

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    # The per-bucket comm hook (opt-in) so that ranksight_allreduce_seconds_total, the per-bucket sum, is not 0.
    mon = ranksight.init(run_dir=run_dir, job="promtest", flush_interval_s=0.5, comm_hook=True)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon.watch(model, optimizer=opt)
    batches = [(torch.randn(128, 16), torch.randn(128, 1)) for _ in range(steps)]
    for x, y in mon.loader(batches):
        with mon.step():
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    open(os.path.join(out_dir, f"trained-{rank}"), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out_dir, "release")) and time.monotonic() < deadline:
        time.sleep(0.2)
    mon.close()
    dist.barrier()
    dist.destroy_process_group()
