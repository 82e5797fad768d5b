from routing.prefix.prefix_index import PrefixIndex


def make_index():
    idx = PrefixIndex()
    idx.apply_stored("r0", [1, 2, 3, 4])
    idx.apply_stored("r1", [1, 2], parent=None)
    idx.apply_stored("r2", [1, 2, 3, 4, 5])
    return idx


def test_match_counts_leading_runs():
    idx = make_index()
    assert idx.match([1, 2, 3, 4, 5, 6]) == {"r0": 4, "r1": 2, "r2": 5}
    assert idx.match([1, 2, 9]) == {"r0": 2, "r1": 2, "r2": 2}
    assert idx.match([7, 1, 2]) == {}
    assert idx.match([]) == {}


def test_only_the_leading_run_counts():
    idx = make_index()
    idx.apply_removed("r2", [3])  # r2 now holds 1, 2, 4, 5: a hole at block 3
    assert idx.match([1, 2, 3, 4, 5]) == {"r0": 4, "r1": 2, "r2": 2}
    assert idx.match([2, 3]) == {"r0": 2, "r2": 1, "r1": 1}


def test_removed_blocks_and_unknown_removals():
    idx = make_index()
    idx.apply_removed("r0", [1])
    idx.apply_removed("r0", [99])  # unknown hash: ignored
    idx.apply_removed("nobody", [1])  # unknown replica: ignored
    assert idx.match([1, 2, 3]) == {"r1": 2, "r2": 3}
    assert idx.num_holders(1) == 2
    assert idx.num_blocks("r0") == 3


def test_cleared_and_removed_replica():
    idx = make_index()
    idx.apply_cleared("r2")
    assert idx.match([1, 2, 3, 4, 5]) == {"r0": 4, "r1": 2}
    assert idx.replicas() == ["r0", "r1"]  # r2 holds nothing now
    assert idx.num_blocks("r2") == 0
    idx.remove_replica("r0")
    assert idx.replicas() == ["r1"]
    assert idx.match([1, 2, 3]) == {"r1": 2}
    assert idx.num_holders(3) == 0


def test_restore_after_clear():
    idx = make_index()
    idx.apply_cleared("r1")
    idx.apply_stored("r1", [1, 2, 3])
    assert idx.match([1, 2, 3, 4]) == {"r0": 4, "r1": 3, "r2": 4}


def test_fanout_marks_shared_heads():
    idx = PrefixIndex(fanout_cap=3)
    for conv in range(5):  # five conversations continue block 1 differently
        idx.apply_stored("r0", [1, 10 + conv, 20 + conv])
    idx.apply_stored("r1", [30, 31], parent=20)  # continuation events with a parent
    idx.apply_stored("r1", [32], parent=20)
    assert idx.fanout(1) == 3  # capped
    assert idx.fanout(10) == 1 and idx.fanout(20) == 2 and idx.fanout(31) == 0
    assert idx.shared_prefix_len([1, 10, 20], min_fanout=3) == 1
    assert idx.shared_prefix_len([1, 10, 20, 30, 31], min_fanout=1) == 4
    assert idx.shared_prefix_len([7, 1], min_fanout=1) == 0
    idx.remove_replica("r0")  # blocks only r0 held are gone, with their fan-out
    assert idx.fanout(1) == 0 and idx.fanout(20) == 0 and idx.fanout(30) == 1


def test_a_system_prompt_of_many_blocks_is_a_shared_head():
    """Each block of a 4-block system prompt has one child but the last, which five conversations
    continue: all 4 are shared, in the index and in a snapshot of it alike; a conversation's own
    blocks are not, nor is a prompt whose chain branches a few ways before any shared block."""
    def index(branch: bool) -> PrefixIndex:
        idx = PrefixIndex()
        for conv in range(5):
            idx.apply_stored("r0", [1, 2, 3, 4, 10 + conv, 20 + conv])
        if branch:
            idx.apply_stored("r1", [1, 2, 30])  # block 2: two children, a few, not many
        return idx

    prompt = [1, 2, 3, 4, 10, 20]
    branched = index(branch=True)
    assert [branched.fanout(h) for h in (1, 2, 3, 4, 10)] == [1, 2, 1, 5, 1]
    assert branched.shared_prefix_len(prompt, min_fanout=3) == 0  # block 2 branches 2 ways first
    idx = index(branch=False)
    assert idx.shared_prefix_len(prompt, min_fanout=3) == 4
    assert idx.shared_prefix_len([1, 2, 3], min_fanout=3) == 0  # ends before the shared block
    assert idx.snapshot(prompt).shared_prefix_len(prompt, min_fanout=3) == 4
    assert idx.shared_prefix_len([10, 20], min_fanout=3) == 0
    # From a block known shared (the caller's popular run ends there), the blocks before it unread:
    assert branched.shared_prefix_len(prompt, min_fanout=3, start=2) == 4  # past the branch at block 2
    assert idx.shared_prefix_len(prompt, min_fanout=3, start=3) == 4
    assert idx.snapshot(prompt).shared_prefix_len(prompt, min_fanout=3, start=2) == 4
    assert idx.shared_prefix_len(prompt, min_fanout=3, start=4) == 0  # a conversation's own blocks


def _leading_runs(index: PrefixIndex, hashes: list[int]) -> dict[str, int]:
    """`match` by its definition, block by block: each replica's leading run of held blocks."""
    out = {}
    for r in index.replicas():
        n = 0
        while n < len(hashes) and index.holds(r, hashes[n]):
            n += 1
        if n:
            out[r] = n
    return out


def test_match_is_each_replicas_leading_run_on_random_indexes():
    """match walks the prompt once, skipping the subset test on blocks the whole fleet holds; on
    random holdings, gaps and repeats it gives exactly the per-block definition."""
    import random
    rng = random.Random(1)
    for trial in range(2000):
        index = PrefixIndex()
        chain = list(range(trial * 100, trial * 100 + rng.randint(0, 40)))
        for r in (f"r{i}" for i in range(rng.randint(1, 8))):
            index.apply_stored(r, chain[:rng.randint(0, len(chain))])
            index.apply_removed(r, rng.sample(chain, min(len(chain), rng.randint(0, 3))))
            if rng.random() < 0.3:
                index.apply_stored(r, rng.sample(chain, min(len(chain), 5)))
        if rng.random() < 0.3:  # a replica leaves, or drops all; one joins in its bit
            gone = rng.choice([f"r{i}" for i in range(8)])
            if rng.random() < 0.5:
                index.remove_replica(gone)
            else:
                index.apply_cleared(gone)
            index.apply_stored(f"n{trial}", chain[:rng.randint(0, len(chain))])
        query = chain[:rng.randint(0, len(chain))] + [-1] * (rng.random() < 0.3) + chain[len(chain) // 2:]
        assert index.match(query) == _leading_runs(index, query), trial
        for h in set(query):
            assert index.num_holders(h) == sum(index.holds(r, h) for r in index.replicas()), trial


def test_the_index_gives_the_cyclic_collector_nothing_per_block():
    """Python's collector traverses every set, and every dict holding one, in each full collection:
    a set of holders and one of children per block stopped a front for 0.9 s at 64 engines' full
    KV (prefix_index.py). The index's per-block state is ints in dicts the collector does not
    track, at any size, with branches, evictions and replicas leaving."""
    import gc
    import random
    rng = random.Random(2)
    index, before = PrefixIndex(), len(gc.get_objects())
    for r in range(8):
        for c in range(50):
            head = [7, 8, 9] if c % 2 else []  # a shared head: blocks with many children
            index.apply_stored(f"r{r}", head + [rng.getrandbits(64) for _ in range(100)])
        index.apply_removed(f"r{r}", rng.sample(sorted(index._held[f"r{r}"]), 500))
    index.remove_replica("r3")
    gc.collect()
    assert not gc.is_tracked(index._holders) and not gc.is_tracked(index._child)
    assert not any(gc.is_tracked(held) for held in index._held.values())
    assert sum(index.num_blocks(f"r{r}") for r in range(8)) > 30_000
    assert len(gc.get_objects()) - before < 50  # the index, its dicts and a few branch points' sets
