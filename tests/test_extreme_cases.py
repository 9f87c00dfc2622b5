"""The default test set's extreme-magnitude cases (issue 16): present for every head dim and mask, carried to
worker processes as plain dicts, and drawn as their kind says (on the CPU here; the GPU draws the same way)."""

import json

import torch

from flashcore_cli.check.case import make_inputs
from flashcore_cli.registry.shapes import INPUT_KINDS, Case, default_cases, parse_shape


def test_the_default_set_holds_every_extreme_kind_at_every_head_dim_and_mask():
    cases = default_cases((64, 128), base_seed=7)
    kinds = {(c.inputs, c.shape.head_dim, c.causal) for c in cases}
    for kind in ("large", "one-hot", "uniform"):
        for d in (64, 128):
            assert (kind, d, False) in kinds and (kind, d, True) in kinds
    assert len({c.seed for c in cases}) == len(cases)  # every case its own inputs
    mha = [c for c in cases if not (c.shape.gqa or c.shape.other_kv_len)]
    assert sum(c.inputs == "randn" for c in mha) == 28  # the random [B, H, S, D] cases are unchanged


def test_a_case_round_trips_through_json_and_stays_hashable():
    for inputs in INPUT_KINDS:
        case = Case(parse_shape("1,2,300,64"), True, 5, inputs)
        assert Case.from_dict(json.loads(json.dumps(case.as_dict()))) == case
        assert len({case, case}) == 1
    plain = Case(parse_shape("1,2,17,64"), False, 3)
    assert plain.as_dict() == {"shape": "1,2,17,64", "causal": False, "seed": 3}  # records of random cases as before
    assert "one-hot" in Case(parse_shape("1,2,17,64"), False, 3, "one-hot").label()


def test_inputs_are_drawn_as_their_kind_says():
    shape = parse_shape("1,2,40,64")
    q, k, v = make_inputs(Case(shape, False, 1, "one-hot"), device="cpu")
    assert torch.equal(q, k) and torch.equal(k, v) and q.dtype == torch.float16
    assert 20 < q.float().std().item() < 40
    q, k, v = make_inputs(Case(shape, False, 1, "uniform"), device="cpu")
    assert torch.equal(k, k[:, :, :1].expand_as(k)) and not torch.equal(q, k)
    scores = q.float() @ k.float().transpose(-1, -2)
    assert torch.equal(scores, scores[..., :1].expand_as(scores))  # every score of a row equal
    q, k, v = make_inputs(Case(shape, False, 1, "large"), device="cpu")
    assert not torch.equal(q, k) and min(t.float().std().item() for t in (q, k, v)) > 20
    a = make_inputs(Case(shape, False, 1), device="cpu")
    b = make_inputs(Case(shape, False, 1), device="cpu")
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # seeded
