"""A failing command prints one line and exits 1; a usage error prints one line before anything loads and exits 2;
``--debug`` lets the traceback through; an interrupt exits 130."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from specprim import cli
from specprim._usage import UsageError


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
    from specprim.models import _hub, _load

    monkeypatch.setattr(_hub, "hub_reachable", lambda: False)
    with pytest.raises(OSError, match=r"not a known model name \(smollm2-135m-instruct.*hub cannot be reached"):
        _load.load("does-not-exist")
    assert cli.main(["generate", "--target", "does-not-exist", "--method", "prompt-lookup", "--prompt", "hi"]) == 2
    assert capsys.readouterr().err == (
        "specprim generate: error: --target does-not-exist: not a known model (smollm2-135m-instruct, "
        "qwen2.5-coder-1.5b-instruct, qwen2.5-coder-0.5b-instruct), a local directory or a model in the Hugging Face "
        "cache, and the hub cannot be reached to look it up (no network, or HF_HUB_OFFLINE=1)\n")


def test_a_hub_id_passes_the_check_when_cached_or_when_the_hub_answers(monkeypatch, tmp_path):
    from huggingface_hub import constants

    from specprim.models import _hub, check_model

    snapshot = tmp_path / "models--org--tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("abc")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(_hub, "hub_reachable", lambda: False)
    check_model("--target", "org/tiny")  # in the Hugging Face cache: from_pretrained reads it offline
    check_model("--target", str(tmp_path))  # a local directory
    check_model("--target", "qwen2.5-coder-0.5b-instruct")  # a known name
    with pytest.raises(UsageError, match="--draft org/other: not a known model"):
        check_model("--draft", "org/other")
    monkeypatch.setattr(_hub, "hub_reachable", lambda: True)
    check_model("--draft", "org/other")  # loading says whether the hub has it


def test_a_model_that_passes_the_check_but_fails_to_load_returns_1_in_one_line(monkeypatch, capsys):
    """A name that can be a hub id but does not load is a failure (1), not a usage error; ``auto`` says what it
    chose only once the models loaded, so the error is the only line."""
    from specprim import recipes
    from specprim.models import _hub

    def fail(recipe, target):
        raise OSError(f"Cannot load {target!r}: not on the hub")

    monkeypatch.setattr(_hub, "hub_reachable", lambda: True)
    monkeypatch.setattr(recipes, "auto", lambda *a, **k: recipes.Choice(recipes.Recipe(), None, "measured"))
    monkeypatch.setattr(recipes, "load_target", fail)
    assert cli.main(["generate", "--target", "org/missing", "--prompt", "hi"]) == 1
    assert capsys.readouterr().err == ("specprim generate: error: Cannot load 'org/missing': not on the hub "
                                       "(--debug shows the traceback)\n")


def test_the_hub_probe_answers_offline_under_hf_hub_offline(monkeypatch):
    from huggingface_hub import constants

    from specprim.models import _hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    _hub.hub_reachable.cache_clear()
    try:
        assert _hub.hub_reachable() is False
    finally:
        _hub.hub_reachable.cache_clear()


def test_a_usage_error_prints_one_line_and_returns_2(monkeypatch, capsys):
    monkeypatch.setattr(cli, "datastore_command", _failing(UsageError("--max-ngram must be >= 1, got 0")))
    assert cli.main(["datastore", "a.txt", "--out", "d.npz"]) == 2
    assert capsys.readouterr().err == "specprim datastore: error: --max-ngram must be >= 1, got 0\n"
    with pytest.raises(UsageError):
        cli.main(["--debug", "datastore", "a.txt", "--out", "d.npz"])


def test_argparse_errors_are_one_line_with_status_2(capsys):
    assert cli.main(["bench", "--dataset", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specprim bench: error: argument --dataset: invalid choice: 'nope'")
    assert len(err.splitlines()) == 1 and "usage:" not in err
    assert cli.main(["generate"]) == 2
    assert capsys.readouterr().err.startswith("specprim generate: error: the following arguments are required: "
                                              "--prompt")
    assert cli.main(["--help"]) == 0


@pytest.fixture
def nothing_loads(monkeypatch):
    """Every way a command loads a model, a tokenizer, a config or a dataset, replaced by one that records the call
    and fails."""
    import transformers

    from specprim import models
    from specprim.bench import _datasets, _run

    calls = []

    def refuse(name):
        def loader(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} was called before the options were checked")

        return loader

    for owner, name in ((models, "load"), (models, "load_tokenizer"), (models, "load_config"),
                        (models, "load_datastore"), (models, "load_head"), (_datasets, "load_dataset"),
                        (_run, "load_dataset"), (transformers.AutoModelForCausalLM, "from_pretrained"),
                        (transformers.AutoTokenizer, "from_pretrained"), (transformers.AutoConfig, "from_pretrained")):
        monkeypatch.setattr(owner, name, refuse(f"{getattr(owner, '__name__', owner)}.{name}"))
    return calls


GENERATE = ["generate", "--prompt", "hi"]
BENCH = ["bench", "--target", "smollm2-135m-instruct", "--dataset", "mt-bench", "--max-new-tokens", "8"]
TUNE = ["tune", "--method", "eagle3"]
USAGE_ERRORS = [
    (GENERATE + ["--temperature", "-1"], "--temperature must be >= 0, got -1.0"),
    (GENERATE + ["--temperature", "nan"], "--temperature must be >= 0, got nan"),
    (GENERATE + ["--max-new-tokens", "-1"], "--max-new-tokens must be >= 1, got -1"),
    (GENERATE + ["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (GENERATE + ["--top-p", "1.5"], r"--top-p must be in \(0, 1\], got 1.5"),
    (GENERATE + ["--top-p", "0"], r"--top-p must be in \(0, 1\], got 0.0"),
    (GENERATE + ["--top-k", "0"], "--top-k must be >= 1, got 0"),
    (GENERATE + ["--recipe", "{tmp}/missing.toml"], "missing.toml' is neither a shipped recipe"),
    (GENERATE + ["--method", "eagle3", "--head", "{tmp}/missing"], "missing' is neither a shipped head"),
    (GENERATE + ["--target", "{tmp}/missing"], "--target .*missing: no such directory"),
    (GENERATE + ["--method", "leviathan", "--draft", "./missing"], "--draft ./missing: no such directory"),
    (GENERATE + ["--method", "leviathan"], "a 'leviathan' part needs a draft model"),
    (GENERATE + ["--method", "prompt-lookup", "--dtype", "bfloat16", "--pack", "--compile"], "exclude each other"),
    (GENERATE + ["--method", "prompt-lookup+datastore", "--datastore", "{tmp}/missing.npz"],
     "is neither a known datastore"),
    (GENERATE + ["--method", "prompt-lookup", "--datastore", "sharegpt"], "the corpus of a 'datastore' part"),
    (GENERATE + ["--method", "eagle3", "--tree", "nonsense"], "tree"),
    (GENERATE + ["--recipe", "{tmp}/bad.toml"], "bad.toml: unknown keys"),
    (["bench", "--target", "smollm2-135m-instruct", "--method", "prompt-lookup"],
     "missing --max-new-tokens, --dataset or --prompts"),
    (BENCH + ["--method", "nope"], "unknown method 'nope'"),
    (BENCH + ["--method", "prompt-lookup", "--temperature", "-1"], "--temperature must be >= 0"),
    (BENCH + ["--method", "prompt-lookup", "--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
    (BENCH + ["--method", "prompt-lookup", "--repeats", "0"], "--repeats must be >= 1, got 0"),
    (BENCH[:3] + ["--prompts", "{tmp}/missing.jsonl", "--max-new-tokens", "8", "--method", "prompt-lookup"],
     "--prompts .*missing.jsonl: no such file"),
    (BENCH + ["--method", "prompt-lookup", "--verifier", "static"], "bench verifies eagerly or compiled"),
    (BENCH + ["--method", "prompt-lookup", "--draft-vocab", "8"], "--draft-vocab applies to a leviathan method"),
    (BENCH + ["--method", "prompt-lookup", "--dtype", "bfloat16", "--pack", "--compile"], "exclude each other"),
    (BENCH + ["--method", "prompt-lookup", "--min-padded", "4"], "bench takes --min-padded from a recipe only"),
    (BENCH + ["--method", "eagle3", "--tree", "nonsense"], "tree"),
    (BENCH + ["--method", "eagle3", "--head", "{tmp}/missing"], "is neither a shipped head"),
    (["bench", "--grid", "{tmp}/missing.toml"], "--grid .*missing.toml: no such file"),
    (["bench", "--grid", "{tmp}/bad.toml", "--target", "x"], "--grid takes every setting from its file; drop --target"),
    (["bench", "--grid", "{tmp}/bad.toml"], "a grid needs a \\[base\\] table"),
    (BENCH + ["--method", "prompt-lookup", "--grid-out", "{tmp}/out.jsonl"], "pass --grid FILE too"),
    (["datastore", "{tmp}/missing.txt", "--out", "{tmp}/d.npz"], "input .*missing.txt: no such file"),
    (["datastore", "{tmp}/bad.toml", "--out", "{tmp}/d.npz", "--min-ngram", "3", "--max-ngram", "2"],
     "need 1 <= --min-ngram <= --max-ngram, got 3 and 2"),
    (["datastore", "{tmp}/bad.toml", "--out", "{tmp}/nowhere/d.npz"], "nowhere/d.npz: the directory .* does not exist"),
    (["train", "distill", "--out", "{tmp}/t"], "kind 'distill' needs --draft"),
    (["train", "eagle3", "--out", "{tmp}/t", "--draft", "smollm2-135m-instruct"], "--draft is the draft LM of kind"),
    (["train", "medusa", "--out", "{tmp}/t", "--align"], "--align trains unrolled draft depths"),
    (["train", "eagle3", "--out", "{tmp}/t", "--align-topk", "3"], "--align-topk softens --align; pass --align"),
    (["train", "eagle3", "--out", "{tmp}/t", "--align", "--align-topk", "0"], "--align-topk must be >= 1"),
    (["train", "medusa", "--out", "{tmp}/t", "--hass-topk", "4"], "--hass-topk trains unrolled draft depths"),
    (["train", "eagle3", "--out", "{tmp}/t", "--hass-topk", "20"], "--hass-topk 20 needs .* --top-k keeps 16"),
    (["train", "eagle3", "--out", "{tmp}/t", "--hass-weight", "2"], "pass --hass-topk K too"),
    (["train", "medusa", "--out", "{tmp}/t", "--head-layers", "2"], "--head-layers sets the decoder layers of eagle3, "
                                                                    "eagle heads; kind 'medusa' has no such choice"),
    (["train", "eagle3", "--out", "{tmp}/t", "--head-layers", "0"], "--head-layers must be >= 1"),
    (["train", "eagle3", "--out", "{tmp}/t", "--hass-topk", "8", "--hass-weight", "0"], "--hass-weight must be > 0"),
    (["train", "eagle3", "--out", "{tmp}/t", "--num-conversations", "0"], "--num-conversations must be >= 1"),
    (["train", "eagle3", "--out", "{tmp}/t", "--batch-tokens", "-5"], "--batch-tokens must be >= 1"),
    (["train", "eagle3", "--out", "{tmp}/t", "--threads", "0"], "--threads must be >= 1"),
    (["train", "eagle3", "--out", "{tmp}/t", "--lr", "0"], "lr must be > 0"),
    (["train", "eagle3", "--out", "{tmp}/t", "--data", "{tmp}/missing.jsonl"], "--data .*missing.jsonl: no such file"),
    (["train", "eagle3", "--out", "{tmp}/t", "--init-from", "{tmp}/missing"], "is neither a shipped head"),
    (["campaign", "run", "{tmp}/run", "--shard-sizes", "0"], "shard_sizes must be"),
    (["campaign", "run", "{tmp}/run", "--holdout", "many"], "cannot read an option value"),
    (["campaign", "run", "{tmp}/run", "--threads", "two"], "--threads must be a number >= 1 or 'auto'"),
    (["campaign", "run", "{tmp}/run", "--max-seconds", "-1"], "--max-seconds must be >= 0"),
    (["campaign", "run", "{tmp}/run", "--data", "{tmp}/missing.jsonl"], "--data .*missing.jsonl: no such file"),
    (["campaign", "status", "{tmp}/run"], "no campaign in .*run \\(campaign.json missing\\)"),
    (TUNE + ["--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
    (TUNE + ["--max-nodes", "0"], "--max-nodes must be >= 1, got 0"),
    (TUNE + ["--head", "{tmp}/missing"], "is neither a shipped head"),
    (TUNE + ["--dtype", "bfloat16", "--pack", "--compile"], "exclude each other"),
    (["tune"], r"pass --method \(or --recipe\)"),
]


@pytest.mark.parametrize(("argv", "message"), USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_usage_errors_exit_2_at_once_before_anything_loads(argv, message, nothing_loads, tmp_path, capsys):
    (tmp_path / "bad.toml").write_text("colour = 3\n")
    argv = [word.replace("{tmp}", str(tmp_path)) for word in argv]
    status = cli.main(argv)
    err = capsys.readouterr().err
    assert nothing_loads == []
    assert status == 2, err
    command = " ".join(argv[:2] if argv[0] == "campaign" else argv[:1])
    assert len(err.splitlines()) == 1 and err.startswith(f"specprim {command}: error: "), err
    assert re.search(message, err), err  # nothing_loads, not a timer, shows it failed before loading


_RUN_AND_LIST_HEAVY_MODULES = """
import sys
from specprim.cli import main
status = main()
print(*sorted(name for name in ("torch", "transformers") if name in sys.modules))
sys.exit(status)
"""


UNKNOWN_MODEL = r"--target does-not-exist: not a known model \(smollm2-135m-instruct, .*HF_HUB_OFFLINE=1\)$"
BEFORE_TORCH = [
    (["generate", "--target", "does-not-exist", "--prompt", "hi"], UNKNOWN_MODEL),
    (["generate", "--temperature", "-1", "--prompt", "hi"], r"--temperature must be >= 0, got -1.0$"),
    (["generate", "--method", "leviathan", "--draft", "does-not-exist", "--prompt", "hi"],
     r"--draft does-not-exist: not a known model"),
    (["datastore", __file__, "--out", "d.npz", "--target", "does-not-exist"], UNKNOWN_MODEL),
    (BENCH[:1] + BENCH[3:] + ["--target", "does-not-exist", "--method", "prompt-lookup"], UNKNOWN_MODEL),
    (BENCH + ["--method", "nope"], "unknown method 'nope'"),
    (TUNE + ["--target", "does-not-exist"], UNKNOWN_MODEL),
    (["train", "eagle3", "--out", "t", "--target", "does-not-exist"], UNKNOWN_MODEL),
    (["campaign", "run", "run", "--target", "does-not-exist"], UNKNOWN_MODEL),
]


@pytest.mark.parametrize(("argv", "message"), BEFORE_TORCH, ids=[" ".join(a) for a, _ in BEFORE_TORCH])
def test_usage_errors_exit_2_in_one_line_before_torch_is_imported(argv, message, tmp_path):
    """The real command line, in a fresh process: exit status 2, one line on stderr, and neither torch nor
    transformers imported (the checks run before them, which is what makes the error come at once)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _RUN_AND_LIST_HEAVY_MODULES, *argv], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    command = " ".join(argv[:2] if argv[0] == "campaign" else argv[:1])
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"specprim {command}: error: "), done.stderr
    assert re.search(message, lines[0]), lines[0]
    assert done.stdout.strip() == "", f"imported before the check: {done.stdout}"
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_s_names_agree_with_the_modules_that_use_them():
    from specprim import _names, bench, models, presets

    assert tuple(presets._BY_NAME) == presets.NAMES == _names.METHODS
    assert bench.method_names() == _names.BENCH_BASELINES + _names.METHODS
    assert set(models.QUANTIZE_SCHEMES) == set(_names.QUANTIZE_SCHEMES)


def test_the_built_in_training_data_pass_the_command_line_checks(tmp_path):
    from specprim import _names, cli
    from specprim.train import _campaign_cli, _cli

    parser = cli.build_parser()
    for source in _names.TRAIN_DATA_SOURCES:
        _cli.check_train(parser.parse_args(["train", "eagle3", "--out", str(tmp_path / "t"), "--data", source]))
        _campaign_cli.check_run(parser.parse_args(["campaign", "run", str(tmp_path / "c"), "--data", source]))
