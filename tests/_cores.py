"""The CPU cores one test process may keep busy."""

import contextlib
import os
from collections.abc import Iterator

import torch


def worker_cores() -> int:
    """The cores this process may run on, shared among the test processes running at once (``pytest -n N`` starts
    N), at least one.

    Two processes whose torch threads outnumber the cores between them wait on each other's starved threads at
    every parallel region and run several times slower than one thread each."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, cores // workers)


@contextlib.contextmanager
def worker_threads() -> Iterator[None]:
    """torch runs :func:`worker_cores` threads inside the block and one after it (the suite's setting, ``conftest``)."""
    torch.set_num_threads(worker_cores())
    try:
        yield
    finally:
        torch.set_num_threads(1)
