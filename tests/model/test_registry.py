"""Which class runs a checkpoint: minirt/model/registry.py, by config.json's model_type."""

import json

import pytest

from conftest import FIXTURES
from minirt.errors import CheckpointError
from minirt.loading.checkpoint import load_checkpoint
from minirt.loading.json_file import read_config
from minirt.model import registry
from minirt.model.backend import numpy_backend
from minirt.model.gpt2 import GPT2


@pytest.mark.parametrize("raw", [{}, {"model_type": None}, {"model_type": "gpt2"}])
def test_gpt2_is_picked_by_its_model_type_or_by_none(raw):
    assert registry.family_for(raw, "config.json") is registry.FAMILIES["gpt2"]


@pytest.mark.parametrize("model_type", ["gemma", "Llama", "GPT2", ["gpt2"], 2])
def test_a_family_minirt_does_not_run_is_refused_naming_it(model_type):
    with pytest.raises(CheckpointError) as refused:
        registry.family_for({"model_type": model_type}, "m/config.json")
    message = str(refused.value)
    assert message.startswith(f"m/config.json: model_type is {model_type!r}, ")
    assert "'gpt2', 'llama', 'mistral', 'qwen2', 'qwen3'" in message and "\n" not in message


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_each_llama_family_type_is_read_by_the_llama_config(model_type):
    family = registry.family_for({"model_type": model_type}, "config.json")
    assert family.model_type == model_type and family.prefix == "model."
    assert (
        family.architecture
        == {
            "llama": "LlamaForCausalLM",
            "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM",
        }[model_type]
    )


def test_a_checkpoint_is_built_as_its_familys_class_and_holds_its_expected_tensors():
    checkpoint = load_checkpoint(FIXTURES / "base")
    family = registry.family_of(checkpoint.config)
    assert family.model_type == checkpoint.config.model_type == "gpt2"
    assert set(checkpoint.tensors) - {"lm_head.weight"} == set(
        family.expected_shapes(checkpoint.config)
    )
    model = registry.build_model(checkpoint, numpy_backend(), "float32")
    assert type(model) is GPT2 and model.config is checkpoint.config


def test_a_new_family_is_one_entry(tmp_path, monkeypatch):
    """A family added to FAMILIES is what config.json's model_type picks: its own config reader."""
    read = []

    def read_toy(raw, source):
        read.append((raw["hidden"], source))
        return "a toy config"

    toy = registry.ModelFamily(
        "toy", "ToyForCausalLM", read_toy, lambda config: {}, GPT2, "toy.", "wte.weight"
    )
    monkeypatch.setitem(registry.FAMILIES, "toy", toy)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "toy", "hidden": 3}))
    assert read_config(path) == "a toy config" and read == [(3, str(path))]
