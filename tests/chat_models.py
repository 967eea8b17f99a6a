"""A chat model for the tests: the shipped model in a folder of its own, with a tokenizer_config.json that
carries a chat template written for the tests (tests/loading/test_chat_template.py, tests/server/
test_chat_completions.py)."""

from __future__ import annotations

import json
import shutil

from tokenizers import Tokenizer as HFTokenizer

from minirt.loading.checkpoint import shipped_model_folder

# A template written for these tests: each role in capitals, the system message first or refused.
TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('the system message must come first') }}{% endif %}"
    "{{ m['role'] | upper }}:\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:\n{% endif %}"
)
EOS = "<|endoftext|>"


def chat_model(folder, template: str = TEMPLATE, **config):
    """The shipped model in `folder`, with a tokenizer_config.json that carries `template`."""
    folder.mkdir(exist_ok=True)
    shipped = shipped_model_folder()
    for name in ("config.json", "tokenizer.json", "generation_config.json"):
        shutil.copy(shipped / name, folder / name)
    (folder / "model.safetensors").symlink_to(shipped / "model.safetensors")
    tokenizer_config = {"eos_token": {"__type": "AddedToken", "content": EOS}, **config}
    if template is not None:
        tokenizer_config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    return folder


def hf_ids(text: str) -> list[int]:
    """The text's ids by the tokenizers library alone, with no special tokens added."""
    tokenizer = HFTokenizer.from_file(str(shipped_model_folder() / "tokenizer.json"))
    return tokenizer.encode(text, add_special_tokens=False).ids
