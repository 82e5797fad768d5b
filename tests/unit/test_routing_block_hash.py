from routing.prefix.block_hash import hash_blocks, default_block_hash

TOKENS = list(range(100, 110))  # 10 tokens: two full blocks of 4, one partial


def test_only_full_blocks_are_hashed():
    assert len(hash_blocks(TOKENS, 4, salt=None)) == 2
    assert hash_blocks(TOKENS[:3], 4, salt=None) == []


def test_hashes_chain_over_the_prefix():
    h = hash_blocks(TOKENS, 4, salt=None)
    assert h[0] == default_block_hash(None, (100, 101, 102, 103), None)
    assert h[1] == default_block_hash(h[0], (104, 105, 106, 107), None)
    # The same tokens after a different prefix hash differently.
    other = hash_blocks([1, 2, 3, 4] + TOKENS[4:8], 4, salt=None)
    assert other[1] != h[1]
    # Continuing from a parent gives the tail of the full chain.
    assert hash_blocks(TOKENS[4:], 4, salt=None, parent=h[0]) == h[1:]


def test_prefix_of_prompt_gives_prefix_of_hashes():
    long = hash_blocks(TOKENS + [7, 8, 9, 10, 11, 12], 4, salt="t")
    assert long[:2] == hash_blocks(TOKENS, 4, salt="t")


def test_tenant_salt_changes_every_hash():
    a = hash_blocks(TOKENS, 4, salt="tenant-a")
    b = hash_blocks(TOKENS, 4, salt="tenant-b")
    plain = hash_blocks(TOKENS, 4, salt=None)
    assert all(x != y for x, y in zip(a, b))
    assert all(x != y for x, y in zip(a, plain))
    # Continuing a chain still salts each block, not only the first.
    assert hash_blocks(TOKENS[4:8], 4, salt="tenant-a", parent=plain[0]) != plain[1:2]


def test_hash_function_is_injected():
    calls = []

    def fake(parent, tokens, salt):
        calls.append((parent, tokens, salt))
        return len(calls)

    assert hash_blocks(TOKENS, 4, salt="s", hash_fn=fake) == [1, 2]
    assert calls == [(None, (100, 101, 102, 103), "s"), (1, (104, 105, 106, 107), "s")]


def test_hashes_are_64_bit():
    assert all(0 <= h < 2**64 for h in hash_blocks(TOKENS, 2, salt="x"))


def test_the_packed_chain_gives_the_per_block_hashes():
    """hash_blocks packs a prompt's tokens once for the default hash; the values are
    default_block_hash's, block by block, whatever the block size, salt and parent."""
    import random

    from routing.prefix.block_hash import hash_blocks, default_block_hash

    rng = random.Random(0)
    for _ in range(100):
        tokens = [rng.randrange(0, 200_000) for _ in range(rng.randint(0, 200))]
        bs, salt = rng.choice([1, 16, 32]), rng.choice([None, "t", "ténant"])
        parent = rng.choice([None, rng.randrange(2**64)])
        want, p = [], parent
        for i in range(len(tokens) // bs):
            p = default_block_hash(p, tuple(tokens[i * bs:(i + 1) * bs]), salt)
            want.append(p)
        assert hash_blocks(tokens, bs, salt, parent) == want


def test_a_first_block_differs_from_one_whose_parent_hashed_to_zero():
    """The chain seeds each block's hash with its parent's: a first block is marked as one, so no
    parent and a parent hashed to 0 give different hashes."""
    assert hash_blocks(TOKENS[:4], 4, salt="t") != hash_blocks(TOKENS[:4], 4, salt="t", parent=0)
    assert hash_blocks(TOKENS, 4, salt="t", parent=0)[1:] == hash_blocks(TOKENS[4:], 4, salt="t",
                                                                         parent=hash_blocks(TOKENS, 4, "t", 0)[0])


def test_packing_in_chunks_gives_one_struct_packs_bytes():
    """pack_tokens packs in chunks of a compiled Struct: the bytes of one `struct.pack` of the
    same ids, for any span, chunk boundaries included."""
    import random
    import struct

    from routing.prefix.block_hash import pack_tokens

    rng = random.Random(1)
    ids = [rng.randrange(0, 2**40) for _ in range(2100)]
    for n, start in [(0, 0), (512, 0), (1024, 0), (1025, 1), (2100, 513)] + \
            [(n, rng.randint(0, n)) for n in (rng.randint(0, 2100) for _ in range(200))]:
        assert pack_tokens(ids, n, start) == struct.pack(f"<{n - start}q", *ids[start:n]), (n, start)
