import pytest

from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.registry.shapes import Shape, attention_flops, default_cases, parse_shape, parse_shapes


def test_parse_shape():
    assert parse_shape("1,8,512,64") == Shape(1, 8, 512, 64)
    assert parse_shape(" 2, 16 ,4096,128") == Shape(2, 16, 4096, 128)


@pytest.mark.parametrize("text", ["1,8,512", "1,8,512,64,1", "a,8,512,64", "1,8,-512,64", "0,8,512,64", "1.5,8,512,64", ""])
def test_bad_shapes_are_clear_errors(text):
    with pytest.raises(FlashcoreError, match="bad shape"):
        parse_shape(text)


def test_parse_shapes_accepts_repeats_and_separators():
    shapes = parse_shapes(["1,8,512,64;2,3,17,128", "4,4,1,64 5,5,5,64"])
    assert [str(s) for s in shapes] == ["1,8,512,64", "2,3,17,128", "4,4,1,64", "5,5,5,64"]


def test_default_cases_cover_the_awkward_lengths_both_masks_and_every_head_dim():
    cases = default_cases((64, 128), base_seed=100)
    lengths = {c.shape.seq_len for c in cases}
    assert {1, 17, 97, 512, 1000, 1025} <= lengths
    assert {c.shape.head_dim for c in cases} == {64, 128}
    assert {c.causal for c in cases} == {False, True}
    assert any(c.shape == Shape(1, 8, 512, 64) for c in cases)
    assert len({c.seed for c in cases}) == len(cases)  # fresh inputs per case
    assert len({(c.shape.batch, c.shape.heads) for c in cases}) > 3


def test_flops():
    s = Shape(2, 16, 4096, 64)
    assert attention_flops(s, False) == 4 * 2 * 16 * 4096**2 * 64
    assert attention_flops(s, True) == attention_flops(s, False) / 2


# ---- grouped-query heads and keys of another length: B,Hq:Hkv,Sq:Sk,D ----
@pytest.mark.parametrize(
    "text, expected",
    [
        ("8,32:8,1:8192,128", Shape(8, 32, 1, 128, 8, 8192)),
        ("1,4,3:1025,64", Shape(1, 4, 3, 64, 4, 1025)),
        ("2,6:2,300,64", Shape(2, 6, 300, 64, 2, 300)),
        ("1,8,512,64", Shape(1, 8, 512, 64, 8, 512)),
    ],
)
def test_parse_grouped_and_uneven_shapes(text, expected):
    shape = parse_shape(text)
    assert shape == expected
    assert parse_shape(str(shape)) == shape  # printed as typed: a record's shape parses back
    assert str(parse_shape("1,8:8,512:512,64")) == "1,8,512,64"  # equal pairs print in the short form


@pytest.mark.parametrize("text, needle", [("1,6:4,8,64", "multiple of the key/value heads"), ("1,8:0,8,64", "at least 1"),
                                          ("1,8,8:,64", "bad shape"), ("1,8:2:1,8,64", "bad shape"), ("1:2,8,8,64", "bad shape")])
def test_bad_grouped_shapes_are_clear_errors(text, needle):
    with pytest.raises(FlashcoreError, match=needle):
        parse_shape(text)


def test_causal_flops_count_the_visible_pairs_bottom_right():
    from flashcore_cli.registry.shapes import visible_pairs

    for sq, sk in [(1, 1), (1, 97), (3, 1025), (17, 4097), (513, 1000), (300, 128), (7, 3), (4, 5)]:
        brute = sum(1 for i in range(sq) for j in range(sk) if j <= i + sk - sq)
        expected = sq * sq / 2 if sq == sk else brute  # Sq = Sk keeps FlashAttention's S^2 / 2 convention
        assert visible_pairs(Shape(1, 1, sq, 64, 1, sk), True) == expected
    decode = Shape(8, 32, 1, 128, 8, 8192)
    assert attention_flops(decode, True) == attention_flops(decode, False) == 4 * 8 * 32 * 8192 * 128


def test_pass_flops_and_bytes():
    from flashcore_cli.registry.shapes import pass_bytes, pass_flops

    s = Shape(8, 32, 1, 128, 8, 8192)
    assert pass_flops(s, False, "bwd") == 2.5 * attention_flops(s, False)
    assert pass_flops(s, False, "fwd+bwd") == 3.5 * attention_flops(s, False)
    kv = 8 * 8 * 8192 * 128
    q = 8 * 32 * 1 * 128
    assert pass_bytes(s, "fwd") == 2 * (2 * q + 2 * kv)  # Q, O and K, V once, 2 bytes each


def test_default_cases_hold_grouped_and_uneven_shapes():
    cases = default_cases((64,), base_seed=1)
    ratios = {c.shape.heads // c.shape.heads_kv for c in cases}
    assert {1, 4, 8, 32} <= ratios
    pairs = {(c.shape.seq_len, c.shape.seq_len_kv) for c in cases}
    assert {(1, 1), (1, 97), (3, 1025), (17, 4097), (513, 1000)} <= pairs
    assert any(c.shape.seq_len > c.shape.seq_len_kv for c in cases)  # rows that see no key under causal
