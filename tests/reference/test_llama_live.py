"""The Llama family against live transformers, on random configs hypothesis draws (whenever torch
and transformers import; CI installs them): each of the four model types, grouped queries of
any ratio, head sizes given or implied, tied or untied, biases, Qwen3's norms, the rope types
minirt computes and their transformers 4 spellings, saved in fp32, fp16 or bf16.  fp32 logits
within 1e-5 of transformers' (computed from the same saved weights), and greedy tokens decoded
with minirt's KV cache equal to transformers' generate."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minirt
from conftest import reference_available, relative_error

pytestmark = [
    pytest.mark.reference,
    pytest.mark.skipif(not reference_available(), reason="torch/transformers not installed"),
]

CLASSES = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
}


@st.composite
def configs(draw):
    model_type = draw(st.sampled_from(sorted(CLASSES)))
    n_kv_head = draw(st.integers(1, 3))
    n_head = n_kv_head * draw(st.integers(1, 3))
    head_dim = 2 * draw(st.integers(1, 6))
    fields = {
        "vocab_size": draw(st.integers(8, 200)),
        # transformers 5 wants the width a multiple of the heads, even with head_dim given; and
        # at least 8 features: RMSNorm over one or two is x / |x|, as ill-conditioned as that.
        "hidden_size": n_head * draw(st.integers(-(-8 // n_head), 8)),
        "intermediate_size": draw(st.integers(4, 64)),
        "num_hidden_layers": draw(st.integers(1, 3)),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv_head,
        "head_dim": head_dim,
        "max_position_embeddings": 96,
        "rms_norm_eps": draw(st.sampled_from([1e-5, 1e-6])),
        "tie_word_embeddings": draw(st.booleans()),
        "rope_theta": draw(st.sampled_from([10000.0, 500000.0, 1e6])),
    }
    if model_type in ("llama", "qwen3"):
        fields["attention_bias"] = draw(st.booleans())
    if model_type == "llama":
        fields["mlp_bias"] = draw(st.booleans())
        scaling = draw(st.sampled_from([None, "linear", "llama3"]))
        if scaling == "linear":
            fields["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
        elif scaling == "llama3":
            fields["rope_scaling"] = {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
    if model_type == "mistral":
        fields["sliding_window"] = None
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    return model_type, fields, dtype, draw(st.integers(0, 2**16))


def saved_model(tmp_path, model_type, fields, dtype, seed):
    """A transformers model of the config with random weights (norms and biases too), saved in
    `dtype`; and that folder loaded by transformers in fp32."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, CLASSES[model_type])(**fields)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1 + 0.2 * torch.randn_like(parameter))
            elif name.endswith("bias"):
                parameter.copy_(0.3 * torch.randn_like(parameter))
            else:
                parameter.copy_(torch.randn_like(parameter) / parameter.shape[-1] ** 0.5)
    folder = tmp_path / "model"
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    # Read back in fp32, as a user would load it: the saved numbers, and RoPE's frequencies made
    # afresh in fp32 (converting the model in place rounds its inv_freq buffer too).
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    return folder, reference.eval()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(drawn=configs())
def test_random_llama_family_models_match_transformers(tmp_path_factory, drawn):
    import torch

    model_type, fields, dtype, seed = drawn
    folder, reference = saved_model(
        tmp_path_factory.mktemp("live"), model_type, fields, dtype, seed
    )
    rng = np.random.default_rng(seed)
    vocab = fields["vocab_size"]
    sequences = [rng.integers(0, vocab, n).tolist() for n in (1, 40, 7)]
    got = minirt.load_model(folder).logits(sequences)
    for b, sequence in enumerate(sequences):
        with torch.no_grad():
            want = reference(torch.tensor([sequence])).logits[0].numpy()
        error = relative_error(got[b, : len(sequence)], want)
        assert error <= 1e-5, (model_type, json.dumps(fields), dtype, b, error)


def test_greedy_with_the_kv_cache_is_transformers_generate(tmp_path):
    """A Llama 3-shaped model (grouped queries, llama3 rope scaling, untied) decoded 24 tokens
    past the scaling's original context by minirt's engine, batched: transformers' generate."""
    import torch

    fields = {
        "vocab_size": 120,
        "hidden_size": 48,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    }
    folder, reference = saved_model(tmp_path, "llama", fields, "float32", 7)
    prompts = [[5, 17, 3, 99, 42, 8, 1, 60, 33, 2, 11, 70], [9, 4]]
    llm = minirt.LLM(folder, batch_size=2)
    params = minirt.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, output in zip(prompts, outputs, strict=True):
        with torch.no_grad():
            want = reference.generate(
                torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=24
            )[0, len(prompt) :].tolist()
        assert output.outputs[0].token_ids == want
