"""Loading: a model folder's files, read and checked, never the network.

    checkpoint.py          where a model is (a folder, the local Hugging Face cache), and its
                           weights
    safetensors_header.py  a safetensors file's header, checked before any tensor is mapped
    json_file.py           the folder's small JSON files, read with a size cap; config.json as
                           GPT2Config
    tokenizer.py           text <-> token ids, with a streaming decoder that never splits a
                           character
    special_tokens.py      every id that ends text (config.json, generation_config.json,
                           tokenizer_config.json), and tokenizer_config.json's settings

Must not know: the engine, requests, sampling, the command line (tests/project/test_layout.py
holds this).
"""
