"""One command surface: a command's flags come from its typed function, `--config FILE` takes the
same keys as `key=value` (which wins), and `--print_config` prints the resolved settings and what
the run derives from them, touching no run folder; the printed YAML read back is the same run."""

from __future__ import annotations

import re

import pytest

from prism.cli import train


def printed(capsys, argv: list[str]) -> str:
    assert train.main([*argv, "--print_config"]) == 0
    return capsys.readouterr().out


def test_train_print_config_round_trips_to_the_same_identity(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = printed(capsys, ["--scale", "tiny", "--schedule", "uniform", "train.lr=1e-3"])
    for derived in ("steps", "world_size", "micro_batch", "accumulation", "precision", "strategy", "run_dir"):
        assert f"#   {derived}: " in first
    digest = re.search(r"#   config_hash: (\w+)", first).group(1)
    (tmp_path / "run.yaml").write_text(first)
    again = printed(capsys, ["--config", str(tmp_path / "run.yaml")])
    assert re.search(r"#   config_hash: (\w+)", again).group(1) == digest
    # key=value wins over the file
    other = printed(capsys, ["--config", str(tmp_path / "run.yaml"), "train.lr=2e-3"])
    assert re.search(r"#   config_hash: (\w+)", other).group(1) != digest
    assert "config_hash: cd053005c4d02873" in printed(capsys, ["--scale", "tiny"])
    assert list(tmp_path.iterdir()) == [tmp_path / "run.yaml"]  # no run folder


@pytest.mark.parametrize(
    "text, sentence",
    [
        ("train: {nope: 1}", "error: config key 'train.nope' is invalid"),
        ("train: {tokens: many}", "error: config key 'train.tokens' is invalid"),
        ("train: {lr: -1}", "error: train.lr=-1.0 is invalid: it must be positive"),
        ("- a list", "error: config file"),
    ],
)
def test_a_bad_config_file_is_one_sentence_and_exit_2(tmp_path, capsys, text, sentence):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(SystemExit) if text.startswith("-") else _returns(2):
        assert train.main(["--scale", "tiny", "--config", str(tmp_path / "bad.yaml"), "--print_config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(sentence) and err.count("\n") == 1 and "Traceback" not in err, err


class _returns:
    def __init__(self, code):
        self.code = code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_run_all_print_config_round_trips_to_the_same_identity(tmp_path, capsys, monkeypatch):
    from prism.cli import run_all

    monkeypatch.chdir(tmp_path)
    assert run_all.main(["--scale", "tiny", "--seeds", "0,1", "--print_config", "train.lr=1e-3"]) == 0
    first = capsys.readouterr().out
    assert "seeds: [0, 1]" in first and "#   world_size: " in first
    (tmp_path / "run.yaml").write_text(first)
    assert run_all.main(["--config", str(tmp_path / "run.yaml"), "--print_config"]) == 0
    digest = re.compile(r"#   config_hash: (\w+)")
    assert digest.search(capsys.readouterr().out).group(1) == digest.search(first).group(1)
    assert list(tmp_path.iterdir()) == [tmp_path / "run.yaml"]
