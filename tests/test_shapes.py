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
