"""ranksight: why your distributed PyTorch job is slow, per rank, and what to change.

Three lines in a training loop::

    mon = ranksight.init(run_dir="ranksight-runs", job="my-job")
    mon.watch(model, optimizer=opt)
    for batch in mon.loader(train_loader):
        with mon.step():
            ...

Importing this package does not import torch; the agent uses the user's torch when it is attached.
"""

from __future__ import annotations

from ._version import __version__

__all__ = ["__version__", "init", "current"]

_current = None


def init(
    run_dir: str | None = None,
    job: str | None = None,
    *,
    run_id: str | None = None,
    enabled: bool = True,
    flush_interval_s: float | None = None,
    prometheus_port: int | None = None,
    prometheus_host: str | None = None,
    otlp_endpoint: str | None = None,
    **options,
):
    """Start the agent on this rank and return its monitor (a no-op monitor when disabled).

    Arguments left as None fall back to ``RANKSIGHT_*`` environment variables, then to defaults;
    ``RANKSIGHT_DISABLED=1`` turns everything off whatever the arguments say. A bad argument raises
    ``ValueError`` here, before training starts; nothing after this point raises into training.
    """
    global _current
    from ranksight.agent import Config, Monitor, NoopMonitor

    config = Config.from_env(
        run_dir=run_dir,
        job=job,
        run_id=run_id,
        enabled=None if enabled else False,
        flush_interval_s=flush_interval_s,
        prometheus_port=prometheus_port,
        prometheus_host=prometheus_host,
        otlp_endpoint=otlp_endpoint,
        **options,
    )
    if not config.enabled:
        return NoopMonitor(config)
    if _current is not None and _current.enabled:
        import logging

        logging.getLogger("ranksight").warning("ranksight: init() called again; closing the previous monitor")
        _current.close()
    _current = Monitor(config)
    return _current


def current():
    """Return the monitor started by the last :func:`init` on this process, or None."""
    return _current
