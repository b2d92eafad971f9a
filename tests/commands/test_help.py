"""`mt-* --help`: every setting a command reads, with the description written once under
its dataclass field, its type and the command's own default; only the command's groups.
That every field has a description is tests/test_config.py's."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from transformer.commands import cli
from transformer.commands import help as cli_help
from transformer.commands.evaluate import EvaluateConfig
from transformer.commands.masks import MasksConfig
from transformer.commands.prepare import PrepareConfig
from transformer.commands.translate import TranslateConfig
from transformer.config import TrainConfig
from transformer.deploy.ct2_export import ExportConfig
from transformer.paths import PROJECT_ROOT

COMMANDS = {"mt-train": ("train", TrainConfig), "mt-translate": ("translate", TranslateConfig),
            "mt-evaluate": ("evaluate", EvaluateConfig), "mt-prepare": ("prepare", PrepareConfig),
            "mt-masks": ("masks", MasksConfig), "mt-export": ("export", ExportConfig)}
TRAINING_ONLY = ("model", "data", "optim", "trainer", "experiment", "debug", "hparams_search")


@pytest.fixture(autouse=True, scope="module")
def _schemas():
    """Each command's dataclass stored as its config's schema, as `cli.hydra_entry` does."""
    for name, schema in COMMANDS.values():
        cli.register_command(name, schema)


def test_a_fields_description_is_its_docstring_not_a_comment():
    @dataclass
    class Example:
        size: int = 3  # a comment is no description
        """How many."""
        name: str = "x"  # a comment only
        items: list[int] = field(default_factory=list)
        """Several
        lines, joined."""

    assert cli_help.field_docs(Example) == {"size": "How many.", "items": "Several lines, joined."}


def _keys(text: str) -> dict[str, tuple[str, str, str]]:
    """key -> (type, default, description) as the help prints them."""
    found, lines = {}, text.splitlines()
    for i, line in enumerate(lines):
        if m := re.fullmatch(r"  (\S+): (.+?) = (.*)", line):
            doc = []
            for after in lines[i + 1:]:
                if not after.startswith("      "):
                    break
                doc.append(after.strip())
            found[m[1]] = (m[2], m[3], " ".join(doc))
    return found


def _groups(text: str) -> list[str]:
    block = text.split("config groups")[1].split("\n\n")[0] if "config groups" in text else ""
    return [line.split()[0] for line in block.splitlines()[1:]]


@pytest.mark.parametrize("prog", COMMANDS)
def test_the_help_prints_every_key_with_its_type_default_and_description(prog):
    name, schema = COMMANDS[prog]
    text = cli_help.help_text(prog, name, schema, [])
    printed = _keys(text)
    expected = {s.key for s in cli_help.settings(schema, cli_help.compose_for_help(name, [])[0])}
    assert set(printed) == expected and len(expected) >= 5
    for key, (kind, default, doc) in printed.items():
        assert kind and default and doc, key


def test_each_command_lists_only_its_own_groups():
    translate = cli_help.help_text("mt-translate", "translate", TranslateConfig, [])
    assert _groups(translate) == ["decode"]
    assert not any(key.startswith(TRAINING_ONLY) for key in _keys(translate))
    assert _groups(cli_help.help_text("mt-export", "export", ExportConfig, [])) == []
    assert _groups(cli_help.help_text("mt-evaluate", "evaluate", EvaluateConfig, [])) == ["data", "decode"]
    train = cli_help.help_text("mt-train", "train", TrainConfig, [])
    assert _groups(train) == ["model", "data", "optim", "trainer", "decode", "experiment", "debug",
                              "hparams_search"]


def test_the_defaults_are_the_commands_own_and_follow_the_overrides_given():
    train = _keys(cli_help.help_text("mt-train", "train", TrainConfig, []))
    translate = _keys(cli_help.help_text("mt-translate", "translate", TranslateConfig, []))
    assert train["decode.method"][1] == "greedy" and translate["decode.method"][1] == "beam"
    assert train["model.d_model"][1] == "256"  # configs/model/small.yaml, train.yaml's choice
    assert train["trainer.max_epochs"][0] == "int or null" and train["trainer.max_epochs"][1] == "null"
    assert train["optim.betas"][1] == "[0.9, 0.98]"
    assert train["data.phases"][0] == "list[{epochs, corpora}]" and train["data.phases"][1] == "[]"
    recipe = cli_help.help_text("mt-train", "train", TrainConfig, ["experiment=tatoeba_cpu", "optim.lr=5e-4"])
    assert _keys(recipe)["trainer.run_dir"][1] == "runs/tatoeba_cpu"
    assert _keys(recipe)["optim.lr"][1] == "0.0005"
    assert "tatoeba_cpu (chosen)" in recipe
    assert "beam, greedy (chosen)" in cli_help.help_text("mt-translate", "translate", TranslateConfig,
                                                         ["decode=greedy"])


def test_the_usage_shows_the_commands_summary_and_examples():
    text = cli_help.usage(sys.modules["transformer.commands.masks"].__doc__)
    summary, examples = text.split("\n\n")
    assert summary.startswith("`mt-masks`: the batch, masks and attention") and "\n" not in summary
    assert examples.splitlines()[0].startswith("    mt-masks sentences=")
    assert examples.splitlines()[1].startswith("             translations=")  # a continued line
    assert len(examples.splitlines()) == 4


def _command(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"transformer.commands.{module}", *args], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_console_help_exits_zero_and_a_bad_override_beside_it_is_one_line():
    proc = _command("translate", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "  decode.beam_size: int = 5\n      Hypotheses kept at each step" in proc.stdout
    assert "echo \"Ciao, come stai?\" | mt-translate" in proc.stdout  # the module's examples
    proc = _command("translate", "-h", "decode=fast")
    assert proc.returncode == 1
    assert proc.stderr.startswith("mt-translate: error: ") and proc.stderr.count("\n") == 1
    assert "decode/fast" in proc.stderr
