"""The model: GPT-2's arithmetic over one round, and the metadata and buffers that round reads.

    backend.py    which array module computes (NumPy, or CuPy on a GPU), and the host crossings
    config.py     GPT2Config: the hyperparameters, checked
    batch.py      Batch: one round's metadata (each row's new tokens, positions, slot, mask)
    kv_cache.py   KVCache: per-request key/value slots, preallocated and filled in place
    layers.py     the layers as pure functions, and the weights each reads
    gpt2.py       GPT2: the weights on a backend, and forward(batch, kv_cache)

Must not know: files, tokenizers, requests, sampling or scheduling (tests/project/test_layout.py
holds this).
"""
