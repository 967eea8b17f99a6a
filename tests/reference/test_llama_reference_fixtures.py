"""The Llama-family fixtures (tools/fixtures/llama_fixtures.py) against what they claim to be.

Without torch: each tokenizer.json, read by the tokenizers library alone, gives expected.json's
ids and decodes; every fixture folder is small and says what its docstring says.
With torch and transformers (`reference`): transformers, reading the committed folders, computes
the committed logits and greedy tokens, tokenizes and renders chats as committed, so the fixtures
can never drift from transformers.
"""

import json
import struct

import pytest
from tokenizers import Tokenizer

from conftest import FIXTURES, load_expected, relative_error, requires_reference

MODEL_FIXTURES = [
    "llama_gqa2",
    "llama3_rope_scaling",
    "llama3_legacy_config",
    "llama_mha_odd_head",
    "mistral_gqa",
    "qwen2_bias",
    "qwen3_norms",
    "llama_sharded",
    "llama_chat_byte_level",
    "mistral_chat_byte_fallback",
]
TOKENIZER_KINDS = ["byte_level", "byte_fallback"]
CHAT_MODELS = {"llama_chat_byte_level": "byte_level", "mistral_chat_byte_fallback": "byte_fallback"}
CHAT_CASES = FIXTURES / "chat_templates" / "cases.json"
MAX_BYTES = 1024 * 1024


def read_json(path):
    return json.loads(path.read_text(encoding="utf-8"))


def file_dtypes(folder):
    """The safetensors dtype codes of every tensor in the folder, read from the headers."""
    codes = set()
    for path in folder.glob("*.safetensors"):
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        codes |= {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    return codes


# ---------------------------------------------------------------------------------------------
# No torch needed


@pytest.mark.parametrize(
    "folder",
    MODEL_FIXTURES + [f"tokenizers/{k}" for k in TOKENIZER_KINDS] + ["chat_templates"],
)
def test_fixture_folders_are_small(folder):
    files = [p for p in (FIXTURES / folder).iterdir() if p.is_file()]
    assert files
    assert all(p.stat().st_size < MAX_BYTES for p in files)
    assert sum(p.stat().st_size for p in files) < MAX_BYTES


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_tokenizers_library_alone_gives_the_expected_ids(kind):
    folder = FIXTURES / "tokenizers" / kind
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    expected = read_json(folder / "expected.json")
    assert tokenizer.get_vocab_size(with_added_tokens=True) == expected["vocab_size"]
    assert len(expected["cases"]) > 10
    for case in expected["cases"]:
        text = case["text"]
        assert tokenizer.encode(text).ids == case["ids"], text
        assert tokenizer.encode(text, add_special_tokens=False).ids == case["ids_no_special"], text
        assert tokenizer.decode(case["ids"], skip_special_tokens=False) == case["decode"], text


def test_tokenizer_special_ids_are_where_the_configs_say():
    level = read_json(FIXTURES / "tokenizers" / "byte_level" / "expected.json")
    fallback = read_json(FIXTURES / "tokenizers" / "byte_fallback" / "expected.json")
    assert (fallback["bos_token_id"], fallback["eos_token_id"]) == (1, 2)
    generation = read_json(FIXTURES / "tokenizers" / "byte_level" / "generation_config.json")
    assert generation["bos_token_id"] == level["bos_token_id"]
    assert (
        len(generation["eos_token_id"]) == 2 and level["eos_token_id"] in generation["eos_token_id"]
    )
    vocab = read_json(FIXTURES / "tokenizers" / "byte_fallback" / "tokenizer.json")["model"][
        "vocab"
    ]
    assert [vocab[f"<0x{b:02X}>"] for b in (0, 255)] == [3, 258]


@pytest.mark.parametrize("name, kind", CHAT_MODELS.items())
def test_chat_models_carry_their_tokenizer(name, kind):
    folder = FIXTURES / name
    for file in ("tokenizer.json", "tokenizer_config.json"):
        assert (folder / file).read_bytes() == (FIXTURES / "tokenizers" / kind / file).read_bytes()
    vocab = read_json(FIXTURES / "tokenizers" / kind / "expected.json")["vocab_size"]
    assert read_json(folder / "config.json")["vocab_size"] == vocab


@pytest.mark.parametrize(
    "name, model_type, heads, kv_heads, head_dim, tied, dtype",
    [
        ("llama_gqa2", "llama", 4, 2, 16, True, "F32"),
        ("llama3_rope_scaling", "llama", 4, 1, 16, False, "BF16"),
        ("llama3_legacy_config", "llama", 4, 1, 16, False, "BF16"),
        ("llama_mha_odd_head", "llama", 5, 5, 12, True, "F16"),
        ("mistral_gqa", "mistral", 4, 2, 16, False, "F32"),
        ("qwen2_bias", "qwen2", 4, 2, None, True, "F32"),
        ("qwen3_norms", "qwen3", 4, 2, 24, True, "F32"),
        ("llama_sharded", "llama", 4, 2, 16, False, "F32"),
    ],
)
def test_model_fixtures_are_what_they_claim(
    name, model_type, heads, kv_heads, head_dim, tied, dtype
):
    config = read_json(FIXTURES / name / "config.json")
    assert config["model_type"] == model_type
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (heads, kv_heads)
    assert config.get("head_dim") == head_dim
    assert config["tie_word_embeddings"] is tied
    assert file_dtypes(FIXTURES / name) == {dtype}
    expected = load_expected(name)
    lengths = {len(expected[k]) for k in expected if k.startswith("seq_")}
    assert len(lengths) > 2 and 1 in lengths
    assert all(expected[f"margin_{g}"].min() >= 1e-3 for g in range(2))


def test_rope_scaling_and_sharding_are_really_there():
    scaled = read_json(FIXTURES / "llama3_rope_scaling" / "config.json")["rope_parameters"]
    assert scaled["rope_type"] == "llama3" and scaled["rope_theta"] == 500000.0
    legacy = read_json(FIXTURES / "llama3_legacy_config" / "config.json")
    assert "rope_parameters" not in legacy and legacy["rope_scaling"]["rope_type"] == "llama3"
    assert legacy["rope_theta"] == 500000.0
    assert (
        load_expected("llama3_rope_scaling")["logits"].shape[1]
        > scaled["original_max_position_embeddings"]
    )
    folder = FIXTURES / "llama_sharded"
    shards = sorted(folder.glob("model-*.safetensors"))
    assert 2 <= len(shards) <= 3
    index = read_json(folder / "model.safetensors.index.json")
    assert set(index["weight_map"].values()) == {p.name for p in shards}


def test_chat_cases_cover_renders_and_refusals():
    cases = read_json(CHAT_CASES)
    assert {"llama3", "qwen2_5_chatml", "llama2", "mistral_inst", "parts_tojson"} <= set(
        cases["templates"]
    )
    assert any("error" in c for c in cases["cases"])
    assert sum("rendered" in c for c in cases["cases"]) > 30


# ---------------------------------------------------------------------------------------------
# Against live transformers


def hf_model(name):
    import torch
    from transformers import AutoModelForCausalLM

    folder = FIXTURES / name
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


@requires_reference
@pytest.mark.parametrize("name", MODEL_FIXTURES)
def test_transformers_computes_the_committed_logits_and_tokens(name):
    from reference import reference_greedy, reference_logits

    expected = load_expected(name)
    model = hf_model(name)
    sequences = [
        expected[f"seq_{b}"].tolist() for b in range(sum(k.startswith("seq_") for k in expected))
    ]
    got = reference_logits(model, sequences)
    assert got.shape == expected["logits"].shape
    assert relative_error(got, expected["logits"]) <= 1e-5
    for g in range(2):
        tokens, _ = reference_greedy(model, expected[f"prompt_{g}"].tolist(), 32)
        assert tokens == expected[f"greedy_{g}"].tolist(), f"{name} prompt {g}"


@requires_reference
def test_transformers_reads_the_legacy_config_as_the_new_one():
    new = hf_model("llama3_rope_scaling").config
    legacy = hf_model("llama3_legacy_config").config
    assert legacy.rope_parameters == new.rope_parameters


@requires_reference
@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_autotokenizer_gives_the_committed_ids_and_decodes(kind):
    from llama_fixtures import tokenizer_expected

    folder = FIXTURES / "tokenizers" / kind
    assert tokenizer_expected(folder) == read_json(folder / "expected.json")


@requires_reference
def test_apply_chat_template_renders_the_committed_cases():
    from transformers import AutoTokenizer

    from llama_fixtures import render

    cases = read_json(CHAT_CASES)
    tokenizers = {
        k: AutoTokenizer.from_pretrained(FIXTURES / "tokenizers" / k) for k in TOKENIZER_KINDS
    }
    for case in cases["cases"]:
        tokenizer = tokenizers[case["tokenizer"]]
        assert tokenizer.special_tokens_map == case["special_tokens"]
        template = cases["templates"][case["template"]]
        got = render(tokenizer, template, case["messages"], case["add_generation_prompt"])
        want = {k: case[k] for k in ("rendered", "error") if k in case}
        assert got == want, (case["template"], case["conversation"])


@requires_reference
@pytest.mark.parametrize("name", CHAT_MODELS)
def test_chat_prompts_tokenize_and_decode_as_committed(name):
    from transformers import AutoTokenizer

    folder = FIXTURES / name
    tokenizer = AutoTokenizer.from_pretrained(folder)
    expected = load_expected(name)
    chat = read_json(folder / "chat_expected.json")
    for g, record in enumerate(chat["prompts"]):
        rendered = tokenizer.apply_chat_template(
            record["messages"], tokenize=False, add_generation_prompt=True
        )
        assert rendered == record["rendered"]
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        assert ids == record["prompt_ids"] == expected[f"prompt_{g}"].tolist()
        assert record["greedy_ids"] == expected[f"greedy_{g}"].tolist()
        assert tokenizer.decode(record["greedy_ids"]) == record["greedy_text"]
