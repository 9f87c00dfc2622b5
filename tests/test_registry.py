"""The registry: good entries load; every kind of broken entry is one clear error naming file, variant, key."""

import pytest

from conftest import FIXTURES, REPO
from flashcore_cli.core.errors import FlashcoreError
from flashcore_cli.registry.variants import load_registry

REGISTRIES = FIXTURES / "registries"


def test_good_registry_loads_every_field():
    reg = load_registry(REGISTRIES / "good.yaml")
    alpha = reg.get("alpha")
    assert reg.get("a1") is alpha
    assert alpha.head_dims == (64, 128) and alpha.causal is True
    assert alpha.defines == {"BLOCK_M": "64", "MODE": "fast"}
    assert alpha.flags == ("-Xptxas=-O3",)
    assert alpha.sources[0].name == "fault.cu" and alpha.sources[0].is_absolute()
    assert alpha.tune.params == {"BLOCK_M": [32, 64]}
    assert alpha.tune.constraints == ["BLOCK_M % 16 == 0"]
    assert reg.root == REPO
    assert reg.get("beta").unsupported_reason(64, causal=True) == "causal masking is not supported by beta"
    assert "supports 64" in reg.get("beta").unsupported_reason(128, causal=False)


def test_project_registry_is_valid_and_kernels_exist():
    reg = load_registry(REPO / "variants.yaml")
    assert "baseline" in reg.names()
    for v in reg.variants:
        assert v.sources and all(p.is_file() for p in v.sources)


@pytest.mark.parametrize(
    "fixture, needles",
    [
        ("unknown_key.yaml", ["variant 'alpha'", "key 'head_dim'", "unknown key"]),
        ("missing_file.yaml", ["variant 'alpha'", "key 'sources'", "does not exist"]),
        ("duplicate_alias.yaml", ["variant 'beta'", "'alpha'", "already used"]),
        ("outside.yaml", ["variant 'alpha'", "key 'sources'", "outside the project"]),
        ("wrong_type.yaml", ["variant 'alpha'", "key 'head_dims'", "list of positive integers"]),
        ("missing_key.yaml", ["variant 'alpha'", "key 'summary'", "missing"]),
        ("bad_yaml.yaml", ["not valid YAML"]),
    ],
)
def test_broken_registries_name_file_variant_and_key(fixture, needles):
    with pytest.raises(FlashcoreError) as info:
        load_registry(REGISTRIES / fixture)
    message = str(info.value)
    assert str(REGISTRIES / fixture) in message
    for needle in needles:
        assert needle in message
    assert info.value.exit_code == 2


def test_macros_in_flags_are_refused(tmp_path):
    bad = tmp_path / "pyproject.toml"
    bad.write_text("")
    (tmp_path / "k.cu").write_text("")
    reg = tmp_path / "variants.yaml"
    reg.write_text(
        "variants:\n  - name: a\n    sources: [k.cu]\n    flags: ['-DFOO=1']\n    summary: s\n    head_dims: [64]\n    causal: true\n"
    )
    with pytest.raises(FlashcoreError, match="key 'flags'.*defines"):
        load_registry(reg)


def test_unknown_variant_suggests_close_names():
    reg = load_registry(REGISTRIES / "good.yaml")
    with pytest.raises(FlashcoreError, match="did you mean alpha"):
        reg.get("alpah")
    with pytest.raises(FlashcoreError, match="unknown variant 'zzz'"):
        reg.get("zzz")


def test_select_needs_names_or_all_but_not_both():
    reg = load_registry(REGISTRIES / "good.yaml")
    assert [v.name for v in reg.select(None, True)] == ["alpha", "beta"]
    assert [v.name for v in reg.select(["a1", "alpha", "beta"], False)] == ["alpha", "beta"]
    with pytest.raises(FlashcoreError, match="not both"):
        reg.select(["alpha"], True)
    with pytest.raises(FlashcoreError, match="--all"):
        reg.select(None, False)
