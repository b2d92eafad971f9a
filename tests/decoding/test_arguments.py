"""decoding/arguments.py: the Translator's arguments checked as mt-translate checks its
overrides, with messages naming the Python keyword; lines, pairs, paths and threads."""

from __future__ import annotations

import shutil

import pytest
import torch

from transformer import Translation
from transformer.checkpoint import CheckpointError
from transformer.config import ConfigError, DecodeConfig
from transformer.decoding.arguments import (
    argument_message,
    as_arguments,
    as_lines,
    as_pairs,
    check_iterable,
    check_path,
    decode_config,
    torch_threads,
)


def test_decode_config_applies_settings_and_leaves_the_base_alone():
    base = DecodeConfig()
    cfg = decode_config(base, {"beam_size": 8, "method": "beam"})
    assert cfg.beam_size == 8 and cfg.method == "beam"
    assert base.beam_size == DecodeConfig().beam_size  # a new config; the base unchanged


@pytest.mark.parametrize("settings, message", [
    ({"beam_sise": 3}, r"^decode\.beam_sise: not a decode setting; the settings are method, "),
    ({"beam_size": 0}, r"^decode\.beam_size=0"),
    ({"beam_size": "many"}, r"decode\.beam_size"),
])
def test_decode_config_names_mt_translates_key(settings, message):
    with pytest.raises(ConfigError, match=message):
        decode_config(DecodeConfig(), settings)


def test_as_arguments_names_the_python_keyword_instead():
    with pytest.raises(ConfigError, match=r"^beam_size=0"), as_arguments():
        decode_config(DecodeConfig(), {"beam_size": 0})
    assert argument_message("decode.method=beamm: use decode=beam") == "method='beamm': use method='beam'"
    assert argument_message("decode.lenpen=-1: must be >= 0") == "lenpen=-1: must be >= 0"


def test_torch_threads_sets_the_count_inside_and_restores_it_even_on_error():
    before = torch.get_num_threads()
    other = 1 if before > 1 else 2
    with pytest.raises(RuntimeError), torch_threads(other):
        assert torch.get_num_threads() == other
        raise RuntimeError
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


def test_lines_are_a_list_of_str_and_a_single_str_says_so():
    assert as_lines("Ciao") == (["Ciao"], True)
    assert as_lines(iter(["a", "b"])) == (["a", "b"], False)
    with pytest.raises(TypeError, match=r"^lines is bytes, not str: decode it first"):
        as_lines(b"Ciao")
    with pytest.raises(TypeError, match=r"^lines\[1\] is a bytes, not a str: decode it first$"):
        as_lines(["a", b"b"])
    with pytest.raises(TypeError, match=r"^lines is a int, not a str or an iterable of str$"):
        as_lines(3)
    with pytest.raises(TypeError, match="for one str use translate"):
        check_iterable("Ciao")


def test_pairs_are_both_str_or_both_lists_of_as_many():
    assert as_pairs("Ciao", "Hi") == (["Ciao"], ["Hi"], True)
    assert as_pairs(["a", "b"], ("x", "y")) == (["a", "b"], ["x", "y"], False)
    assert as_pairs("Ciao", ["▁Hi", "!"]) == (["Ciao"], [["▁Hi", "!"]], True)  # one line's pieces
    assert as_pairs(["a"], [["▁x"]]) == (["a"], [["▁x"]], False)
    with pytest.raises(TypeError, match="both as a str, or both as lists"):
        as_pairs(["Ciao"], "Hi")
    with pytest.raises(TypeError, match="both as a str"):
        as_pairs("Ciao", 3)
    with pytest.raises(TypeError, match=r"^targets\[0\] is a list holding a non-str"):
        as_pairs("Ciao", ["▁Hi", 3])
    with pytest.raises(ValueError, match=r"^2 sources but 1 targets"):
        as_pairs(["a", "b"], ["x"])
    with pytest.raises(TypeError, match=r"^targets\[0\] is a NoneType"):
        as_pairs(["a"], [None])
    found = Translation("Hi", -1.0, ["▁Hi"], segments=[1])  # score() takes its Translations
    assert as_pairs("Ciao", found, Translation) == (["Ciao"], [found], True)
    assert as_pairs(["a", "b"], [found, "x"], Translation) == (["a", "b"], [found, "x"], False)
    with pytest.raises(TypeError, match=r"^targets\[0\] is a Translation, not a str or a list"):
        as_pairs(["a"], [found])
    with pytest.raises(TypeError, match=r"^targets\[0\] is a int, not a str, a list of pieces "
                                        r"\(str\) or a Translation"):
        as_pairs(["a"], [3], Translation)


def test_check_path_takes_a_checkpoint_and_names_what_else_it_was_given(checkpoint, tmp_path):
    assert check_path(str(checkpoint)) == checkpoint
    with pytest.raises(CheckpointError, match="no checkpoint given"):
        check_path("")
    with pytest.raises(CheckpointError, match="no such directory"):
        check_path(tmp_path / "absent")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        check_path(tmp_path / "file")
    with pytest.raises(CheckpointError, match="is neither a checkpoint directory"):
        check_path(tmp_path)


def test_check_path_takes_a_run_directory_as_its_best_checkpoint(checkpoint, tmp_path):
    """Translator.load("runs/x") as mt-translate's checkpoint=runs/x: the run's best."""
    best = tmp_path / "run" / "checkpoints" / "best"
    shutil.copytree(checkpoint, best)
    assert check_path(tmp_path / "run") == best
    assert check_path(str(tmp_path / "run" / "checkpoints")) == best
