"""The CPU cores one test process may keep busy."""

import os


def worker_cores() -> int:
    """The cores this process may run on, shared among the test processes running at once (``pytest -n N`` starts
    N), at least one.

    Two processes whose torch threads outnumber the cores between them wait on each other's starved threads at
    every parallel region and run several times slower than one thread each."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, cores // workers)
