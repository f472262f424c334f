"""A failing command prints one line and exits 1; ``--debug`` lets the traceback through; an interrupt exits 130."""

from __future__ import annotations

import pytest

from specprim import cli


def _failing(error: BaseException):
    def command(args):
        raise error

    return command


def test_a_failure_prints_one_line_and_returns_1(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli, "datastore_command", _failing(RuntimeError("the weights are cut short\nsecond line")))
    assert cli.main(["datastore", "a.txt", "--out", str(tmp_path / "d.npz")]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == ("specprim datastore: error: the weights are cut short "
                                            "(--debug shows the traceback)")
    assert "Traceback" not in err and "second line" not in err
    monkeypatch.setattr(cli, "datastore_command", _failing(KeyError("q_proj")))
    assert cli.main(["datastore", "a.txt", "--out", "d.npz"]) == 1
    assert "error: KeyError: 'q_proj'" in capsys.readouterr().err


def test_debug_anywhere_shows_the_traceback(monkeypatch):
    monkeypatch.setattr(cli, "datastore_command", _failing(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["datastore", "a.txt", "--debug", "--out", "d.npz"])
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["--debug", "datastore", "a.txt", "--out", "d.npz"])


def test_an_interrupt_returns_130(monkeypatch, capsys):
    monkeypatch.setattr(cli, "datastore_command", _failing(KeyboardInterrupt()))
    assert cli.main(["datastore", "a.txt", "--out", "d.npz"]) == 130
    assert capsys.readouterr().err.strip() == "specprim datastore: interrupted"


def test_an_unknown_model_without_network_fails_at_once_naming_the_known_models(monkeypatch, capsys):
    from specprim.models import _load

    monkeypatch.setattr(_load, "hub_reachable", lambda: False)
    with pytest.raises(OSError, match=r"not a known model name \(smollm2-135m-instruct.*hub cannot be reached"):
        _load.load("does-not-exist")
    with pytest.raises(SystemExit, match="specprim generate: error: Cannot load 'does-not-exist'"):
        cli.main(["generate", "--target", "does-not-exist", "--prompt", "hi"])


def test_the_hub_probe_answers_offline_under_hf_hub_offline(monkeypatch):
    from huggingface_hub import constants

    from specprim.models import _load

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    _load.hub_reachable.cache_clear()
    try:
        assert _load.hub_reachable() is False
    finally:
        _load.hub_reachable.cache_clear()
