"""Settings are checked when the config is built: every range, with the key in the message."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from transformer.config import (
    ConfigError,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    TrainConfig,
    to_dataclass,
)
from transformer.paths import CONFIG_DIR


def train_config(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return to_dataclass(TrainConfig, compose("train", overrides=list(overrides)))


def test_the_defaults_and_every_group_file_are_valid():
    TrainConfig().validate()
    for group in ("model", "data", "optim", "trainer", "decode"):
        for f in sorted((CONFIG_DIR / group).glob("*.yaml")):
            if f.stem != "files":  # its train_src is required (???)
                train_config(f"{group}={f.stem}")


# (override, what the one-line message must say): each of these used to crash deep inside
# training (IndexError, ZeroDivisionError, torch or sentencepiece internals) or train wrong.
BAD_TRAINING_SETTINGS = [
    ("trainer.accum_steps=0", "trainer.accum_steps=0: must be >= 1"),
    ("trainer.val_every=0", "trainer.val_every=0: must be >= 1"),
    ("trainer.max_steps=-3", "trainer.max_steps=-3: must be >= 1"),
    ("trainer.max_hours=0", "trainer.max_hours=0.0: must be > 0"),
    ("trainer.keep_last=-1", "trainer.keep_last=-1: must be >= 0"),
    ("trainer.patience=0", "trainer.patience=0: must be >= 1 (or null)"),
    ("trainer.precision=fp8", "trainer.precision='fp8': choose one of auto, fp32, bf16, fp16"),
    ("trainer.device=gpu", "trainer.device='gpu': choose auto, cpu, cuda or cuda:N"),
    ("trainer.seed=-1", "trainer.seed=-1: must be >= 0"),
    ("model.n_heads=0", "model.n_heads=0: must be >= 1"),
    ("model.n_heads=3", "model.n_heads=3: must divide model.d_model=256"),
    ("model.dropout=1.0", "model.dropout=1.0: must be in [0, 1)"),
    ("model.max_positions=100", "model.max_positions=100: must exceed data.max_len=128"),
    ("optim.lr=-1", "optim.lr=-1.0: must be > 0"),
    ("optim.label_smoothing=1.5", "optim.label_smoothing=1.5: must be in [0, 1)"),
    ("optim.betas=[0.9,1.5]", "optim.betas=[0.9, 1.5]: must be two numbers in [0, 1)"),
    ("optim.warmup_steps=-1", "optim.warmup_steps=-1: must be >= 0"),
    ("data.max_tokens=100", "data.max_tokens=100: a batch must hold the longest pair"),
    ("data.spm_vocab_size=3", "data.spm_vocab_size=3: must be >= 5"),
    ("data.name=wikipedia", "data.name='wikipedia': choose one of"),
    ("data.spm_model_type=word", "data.spm_model_type='word': choose unigram or bpe"),
    ("+data.corpora={tatoeba:1}", "data.corpora={'tatoeba': 1.0}: only for data.name=mix"),
    ("decode.nbest=3", "decode.nbest=3: greedy search gives one hypothesis"),
]


@pytest.mark.parametrize(("override", "message"), BAD_TRAINING_SETTINGS)
def test_an_out_of_range_setting_is_refused_naming_its_key(override, message):
    with pytest.raises(ConfigError) as info:
        train_config(override)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_mix_names_known_corpora_with_positive_weights():
    DataConfig(name="mix", corpora={"tatoeba": 1.0, "europarl": 2.0}).validate()
    with pytest.raises(ConfigError, match=r"data.corpora=\{\}: name=mix needs corpora"):
        DataConfig(name="mix").validate()
    with pytest.raises(ConfigError, match=r"data.corpora='files': can mix the named corpora"):
        DataConfig(name="mix", corpora={"files": 1.0}).validate()
    with pytest.raises(ConfigError, match=r"data.corpora.europarl=0.0: a weight must be > 0"):
        DataConfig(name="mix", corpora={"tatoeba": 1.0, "europarl": 0.0}).validate()


BAD_SCHEDULES = [
    ("data.phases=[{epochs: 1, corpora: {flores: 1}}]",
     "data.phases[0].corpora='flores': not a corpus of the mix (data.corpora: europarl, tatoeba)"),
    ("data.phases=[{epochs: -1, corpora: {tatoeba: 1}}]", "data.phases[0].epochs=-1: must be >= 0"),
    ("data.phases=[{epochs: 1, corpora: {tatoeba: -1}}]",
     "data.phases[0].corpora.tatoeba=-1.0: a weight must be >= 0"),
    ("data.phases=[{epochs: 1, corpora: {tatoeba: 1}}, {epochs: 2, corpora: {europarl: 0}}]",
     "data.phases[1].corpora={'europarl': 0.0}: a phase needs a corpus with a weight > 0"),
    ("data.epoch_pairs=0", "data.epoch_pairs=0: must be >= 1 (or null)"),
]


@pytest.mark.parametrize(("override", "message"), BAD_SCHEDULES)
def test_a_mixs_schedule_is_checked_naming_its_key(override, message):
    cfg = train_config("data=europarl_tatoeba", "data.epoch_pairs=1000",
                       "data.phases=[{epochs: 2, corpora: {tatoeba: 1}}, {epochs: 0, corpora: {europarl: 1}}]")
    assert [(p.epochs, p.corpora) for p in cfg.data.phases] == [(2, {"tatoeba": 1.0}), (0, {"europarl": 1.0})]
    with pytest.raises(ConfigError) as info:
        train_config("data=europarl_tatoeba", override)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_schedule_is_for_a_mix_only():
    for override in ("data.epoch_pairs=1000", "data.phases=[{epochs: 1, corpora: {tatoeba: 1}}]"):
        with pytest.raises(ConfigError, match=r"only for data.name=mix"):
            train_config("data=tatoeba", override)


BAD_DECODE_SETTINGS = [
    (dict(max_len_a=-1.0, max_len_b=-5), "decode.max_len_a=-1.0: must be >= 0"),
    (dict(max_len_a=0.0, max_len_b=-5), "decode.max_len_b=-5: must be >= 0"),
    (dict(max_len_a=0.0, max_len_b=0), "the length limit a * |x| + b could be 0"),
    (dict(method="greedy", nbest=3), "decode.nbest=3: greedy search gives one hypothesis"),
    (dict(method="beam", beam_size=2, nbest=3), "decode.nbest=3: cannot exceed decode.beam_size=2"),
    (dict(beam_size=0), "decode.beam_size=0: must be >= 1"),
    (dict(min_len=-1), "decode.min_len=-1: must be >= 0"),
    (dict(lenpen=-0.5), "decode.lenpen=-0.5: must be >= 0"),
    (dict(method="sampling"), "decode.method='sampling': choose greedy or beam"),
    (dict(precision="int8"), "decode.precision='int8': choose one of auto, fp32, bf16, fp16"),
]


@pytest.mark.parametrize(("settings", "message"), BAD_DECODE_SETTINGS)
def test_bad_decode_settings_are_refused(settings, message):
    with pytest.raises(ConfigError) as info:
        DecodeConfig(**settings).validate()
    assert message in str(info.value)


def test_model_config_checks_its_special_ids():
    with pytest.raises(ConfigError, match=r"model.eos_id=9: must be a token id below model.vocab_size=8"):
        ModelConfig(vocab_size=8, eos_id=9).validate()
    with pytest.raises(ConfigError, match="three different ids"):
        ModelConfig(vocab_size=8, bos_id=3, eos_id=3).validate()
