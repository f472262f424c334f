import pytest
import torch
from _cores import worker_cores

# Tests run many small tensor ops: one intra-op thread is much faster and steadier on a 2-core machine.
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _subprocess_threads():
    """Processes the tests start (notebook kernels, fresh interpreters) use this test process's share of the cores:
    under ``pytest -n 2`` on two cores, a kernel with two threads beside the other worker would slow both."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", str(worker_cores()))
        yield


@pytest.fixture(autouse=True)
def _quick_auto_measurement(tmp_path_factory, monkeypatch):
    """``auto`` on a target without a shipped recipe measures its candidates: in tests only prompt lookup (no
    datastore to build), with the measured choices kept out of the user's cache. (Imported here, not at the top: some
    test modules check what importing specprim does first.)"""
    from specprim.recipes import Recipe, _measure

    monkeypatch.setattr(_measure, "CANDIDATES", (Recipe(),))
    monkeypatch.setattr(_measure, "cache_root", lambda: tmp_path_factory.getbasetemp() / "auto")


@pytest.fixture(autouse=True)
def _compiled_forwards_in_process(monkeypatch):
    """Compiled static forwards compile with ``torch.compile`` in tests (whose counters several tests read) and leave
    no packages in the user's cache; tests/test_aot_forward.py switches the packages on, in a temporary cache."""
    monkeypatch.setenv("SPECPRIM_AOT", "0")
