"""The command line as the user means it (transformer/commands/overrides.py): a mix override replaces
the mix, a corpus is added without `+`, a null setting can be deleted, a comma in a text
setting is that text. Each is composed with the real configs, as the commands do."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from omegaconf import OmegaConf

from transformer.commands import prepare
from transformer.commands.evaluate import EvaluateConfig
from transformer.commands.overrides import rewrite
from transformer.commands.train import fill_reset_settings
from transformer.config import ModelConfig, TrainConfig, to_dataclass

from helpers import compose_cfg, shared_cache


def composed(schema, *args: str, config: str = "train"):
    return to_dataclass(schema, compose_cfg(*rewrite(list(args), schema), config=config))


@pytest.mark.parametrize("override", ["data.corpora={tatoeba: 1}", "+data.corpora={tatoeba: 1}",
                                      "++data.corpora={tatoeba: 1}"])
def test_a_mix_override_replaces_the_mix(override):
    assert composed(TrainConfig, "data=europarl_tatoeba").data.corpora == {"europarl": 1.0, "tatoeba": 1.0}
    cfg = composed(TrainConfig, "data=europarl_tatoeba", override)
    assert cfg.data.corpora == {"tatoeba": 1.0}


def test_a_corpus_is_added_to_a_mix_without_a_plus_and_a_bad_one_is_named():
    cfg = composed(TrainConfig, "data=europarl_tatoeba", "data.corpora.opus100=2")
    assert cfg.data.corpora == {"europarl": 1.0, "tatoeba": 1.0, "opus100": 2.0}
    cfg = composed(TrainConfig, "data=europarl_tatoeba", "data.corpora={tatoeba: 1, opus100: 1}")
    assert cfg.data.corpora == {"tatoeba": 1.0, "opus100": 1.0}
    with pytest.raises(ValueError, match=r"data.corpora='nope': can mix the corpora"):
        composed(TrainConfig, "data=europarl_tatoeba", "data.corpora.nope=1")


def test_deleting_a_setting_gives_its_default_even_when_it_is_null():
    assert composed(TrainConfig, "~trainer.max_hours").trainer.max_hours is None
    assert composed(TrainConfig, "trainer.max_hours=2", "~trainer.max_hours").trainer.max_hours is None
    assert composed(TrainConfig, "trainer.max_steps=7", "~trainer.max_steps").trainer.max_steps == 100_000
    assert rewrite(["~model"], TrainConfig) == ["~model"]  # a group: Hydra drops it, the schema stays
    assert composed(TrainConfig, "model=tiny", "~model").model == ModelConfig()


def test_a_setting_reset_on_the_command_line_is_saved_as_its_default():
    """A deleted list or dict setting composes as missing ('???': a setting of a group's
    dataclass schema cannot be deleted); the saved config holds its default."""
    assert rewrite(["~optim.betas", "~data.phases"], TrainConfig) == ["optim.betas='???'", "data.phases='???'"]
    cfg = compose_cfg(*rewrite(["optim.betas=[0.5,0.6]", "~optim.betas", "~data.phases"], TrainConfig))
    assert OmegaConf.is_missing(cfg.optim, "betas")
    fill_reset_settings(cfg, dataclasses.asdict(to_dataclass(TrainConfig, cfg)))
    assert OmegaConf.to_container(cfg.optim)["betas"] == [0.9, 0.98] and cfg.data.phases == []


def test_a_comma_in_a_text_setting_is_text_and_sweeps_stay_sweeps():
    cfg = composed(EvaluateConfig, "checkpoint=x", "test_set=path/to/src.it,path/to/ref.en", config="evaluate")
    assert cfg.test_set == "path/to/src.it,path/to/ref.en"
    assert rewrite(["-m", "optim.lr=1e-3,5e-4"], TrainConfig) == ["-m", "optim.lr=1e-3,5e-4"]
    assert rewrite(["-m", "data.name=a,b"], TrainConfig) == ["-m", "data.name=a,b"]
    assert rewrite(["--cfg", "job", "test_set=a,b"], EvaluateConfig) == ["--cfg", "job", "test_set='a,b'"]


def test_mt_prepare_of_a_replaced_mix_prepares_only_its_corpora_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [
        "mt-prepare", "data=europarl_tatoeba", "data.corpora={sample: 1}", "data.spm_vocab_size=300",
        "data.max_tokens=1024", "data.spm_input_sentence_size=2000", f"data.cache_dir={shared_cache()}",
        "data.num_proc=1"])
    prepare.main()
    out = capsys.readouterr().out
    assert out.startswith("mix (sample 1): prepared data ")
    assert "train/sample: 400 pairs" in out and "europarl" not in out and "tatoeba" not in out


@pytest.mark.parametrize("value", ["dir/città.it", "my dir/città.it", "perché/così è.it"])
def test_a_path_with_an_accented_letter_is_that_path(value):
    """Hydra stopped at the `à` (LexerNoViableAltException); Italian users meet it first (#51.4)."""
    from transformer.commands.translate import TranslateConfig

    assert rewrite([f"input.file={value}"], TranslateConfig) == [f"input.file='{value}'"]
    cfg = composed(TranslateConfig, "checkpoint=x", f"input.file={value}", config="translate")
    assert cfg.input.file == value


@pytest.mark.parametrize("arg", ["sentences=[città]", "input.file=dir/città's.it", "a=città,roma",
                                 "input.file='dir/città.it'", 'input.file="dir/città.it"', "x=città\\"])
def test_values_hydra_reads_otherwise_are_left_to_it(arg):
    """A list, a quote, a sweep, an escape: quoting would change what they mean."""
    from transformer.commands.translate import TranslateConfig

    assert rewrite([arg], TranslateConfig) == [arg]
