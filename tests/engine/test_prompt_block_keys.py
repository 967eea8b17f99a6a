"""`prompt_block_keys`, what the prefix router matches prompts by (minirt/distributed/
prefix_router.py): key i stands for the prompt's first i + 1 blocks, and there are as many keys as
the prefix cache could ever find for that prompt."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minirt.engine.prefix_cache import BLOCK_TOKENS, prompt_block_keys

# A small vocabulary, so that drawn prompts share long prefixes often.
tokens = st.integers(min_value=0, max_value=2)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=300, deadline=None)
@given(
    stem=st.lists(tokens, max_size=80),
    tail_a=st.lists(tokens, max_size=40),
    tail_b=st.lists(tokens, max_size=40),
)
def test_two_prompts_share_exactly_the_keys_of_their_shared_whole_blocks(stem, tail_a, tail_b):
    a = stem + tail_a
    b = stem + tail_b
    keys_a = prompt_block_keys(a)
    keys_b = prompt_block_keys(b)
    # As many as the prefix cache may use: the last token is always prefilled.
    assert len(keys_a) == max(0, (len(a) - 1) // BLOCK_TOKENS)
    shared_keys = common_prefix(list(keys_a), list(keys_b))
    whole_blocks = common_prefix(a, b) // BLOCK_TOKENS
    assert shared_keys == min(whole_blocks, len(keys_a), len(keys_b))


def test_a_block_boundary_exactly():
    # 17 tokens: one whole block before the last token; 16 tokens: none (the last is prefilled).
    assert len(prompt_block_keys(list(range(17)))) == 1
    assert prompt_block_keys(list(range(16))) == ()
    # The same 16 tokens after a different block: a different key (it stands for all 32).
    first = prompt_block_keys(list(range(33)))
    second = prompt_block_keys([99] * 16 + list(range(16, 33)))
    assert first[1] != second[1]
