"""The model: a family's arithmetic over one round, and the metadata and buffers that round reads.

    backend.py    which array module computes (NumPy, or CuPy on a GPU), and the host crossings
    interface.py  ModelConfig and Model: what the engine knows of any model
    config.py     GPT2Config: the hyperparameters, checked
    batch.py      Batch: one round's metadata (each row's new tokens, positions, slot, mask)
    kv_cache.py   KVCache: per-request key/value slots (by K/V head), preallocated, filled in place
    fusion.py     the layers' elementwise chains, each one GPU kernel (cupy.fuse)
    layers.py     the layers every family composes, as pure functions, and the weights they read
    gpt2.py       GPT2: GPT-2's composition of them, its weights on a backend, forward(batch, kv)
    registry.py   which family's class runs a checkpoint, from config.json's model_type

Must not know: files, tokenizers, requests, sampling or scheduling (tests/project/test_layout.py
holds this).
"""
