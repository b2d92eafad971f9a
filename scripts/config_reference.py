"""Print docs/configuration.md, the settings reference, from the dataclasses' docstrings:
python scripts/config_reference.py > docs/configuration.md"""

from transformer.commands.evaluate import EvaluateConfig
from transformer.commands.help import reference_markdown
from transformer.commands.masks import MasksConfig
from transformer.commands.prepare import PrepareConfig
from transformer.commands.translate import TranslateConfig
from transformer.config import TrainConfig
from transformer.deploy.ct2_export import ExportConfig

COMMANDS = {"mt-translate": TranslateConfig, "mt-evaluate": EvaluateConfig, "mt-prepare": PrepareConfig,
            "mt-export": ExportConfig, "mt-masks": MasksConfig}

if __name__ == "__main__":
    print(reference_markdown(TrainConfig, COMMANDS), end="")
