# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Breakable device-graph capture made right for XPU (and CUDA).

Builds on :mod:`vllm.compilation.breakable_cudagraph` (capture segments,
run decorated ops eagerly between them) and adds what a correct XPU run
needs, all switched on by the series' ``breakable_graph`` option:

* an explicit device-graph choice (``torch.xpu.XPUGraph`` on XPU,
  ``torch.cuda.CUDAGraph`` on CUDA) with the graph pool and the capture
  stream taken from the platform, instead of relying on the global
  ``torch.cuda.CUDAGraph`` alias set up by the XPU model runner; tests
  inject their own graph class through :class:`DeviceGraphBackend`;
* tensor-parallel all-reduce as an eager break whose result is written in
  place into a buffer owned by the capture, so the next graph segment reads
  the same address on every replay (:func:`breakable_all_reduce`);
* break accounting by kind, checked against the expected topology of the
  model when it is known, a ceiling on the number of segments, and one
  audited log line per captured shape;
* first-capture materialisation: kernels recorded into a graph do not run
  during capture, so each closed segment is replayed once before the next
  eager break consumes its output, and the last one before returning;
* guards on what captured segments read, cheap enough for every replay:
  the model inputs and the KV-cache slot mapping (the cache write is
  captured inside a graph segment) must be at the captured addresses, and
  an eager break whose result the next segment reads must return the
  captured memory (in-place breaks are so by construction and are not
  re-checked). The attention metadata is not guarded: attention runs in an
  eager break and reads the current step's metadata, which DFlash rebuilds
  from new tensors every step. The full structural checks (pointer,
  storage offset, shape, stride, dtype, device of every nested tensor, and
  the result of every eager break) run in debug mode
  (``VLLM_LOGGING_LEVEL=DEBUG``, as upstream's wrapper);
* one capture stream shared by every capture of the process (target and
  drafter), so that their graphs can share the graph memory pool, and
  captured outputs held through weak references, as upstream does;
* accounting of captures, graphs, breaks by kind and replays
  (:meth:`XpuBreakableGraphWrapper.accounting`) for reports and records.

Modules, each importing only those listed before it:

* ``errors``: the errors raised by the capture and the configuration;
* ``backends``: the device-graph choice, the shared capture stream and the
  graphs a platform names for itself (the CPU emulation's);
* ``topology``: break kinds and the expected topology of a decoder;
* ``guards``: static identity of tensors and the replay probe;
* ``config``: the toggles and :func:`configure_breakable_graph`;
* ``capture``: :class:`XpuBreakableGraphCapture`;
* ``collectives``: :func:`breakable_all_reduce`;
* ``wrapper``: :class:`XpuBreakableGraphWrapper` and the model runner's
  hooks.

The public names are re-exported here; code of the series imports each
from its module.
"""

from vllm.xpu_laguna.graphs.backends import (
    DeviceGraph,
    DeviceGraphBackend,
    device_graph_backend,
    platform_graph_backend,
    shared_capture_stream,
)
from vllm.xpu_laguna.graphs.capture import XpuBreakableGraphCapture
from vllm.xpu_laguna.graphs.collectives import (
    all_reduce_into,
    breakable_all_reduce,
)
from vllm.xpu_laguna.graphs.config import (
    apply_breakable_graph_settings,
    breakable_graph_enabled,
    configure_breakable_graph,
    debug_checks_enabled,
    xpu_laguna_series_active,
)
from vllm.xpu_laguna.graphs.errors import (
    BreakableGraphConfigError,
    BreakableGraphError,
    CaptureCeilingError,
    OutOfPlaceBreakError,
    StaticInputMismatchError,
    TopologyMismatchError,
)
from vllm.xpu_laguna.graphs.guards import (
    StaticInputProbe,
    TensorIdentity,
    first_difference,
    reachable_tensor_identities,
    slot_mapping_representatives,
    static_input_identities,
    static_input_pointers,
    static_input_probe,
)
from vllm.xpu_laguna.graphs.topology import (
    LAGUNA_ARCHITECTURES,
    BreakKind,
    ExpectedTopology,
    expected_topology_for,
)
from vllm.xpu_laguna.graphs.wrapper import (
    ACCOUNTING_EVERY,
    ACCOUNTING_MARK,
    XpuBreakableGraphWrapper,
    graph_accounting,
    preset_breakable_runner,
)

__all__ = [
    "ACCOUNTING_EVERY",
    "ACCOUNTING_MARK",
    "LAGUNA_ARCHITECTURES",
    "BreakKind",
    "BreakableGraphConfigError",
    "BreakableGraphError",
    "CaptureCeilingError",
    "DeviceGraph",
    "DeviceGraphBackend",
    "ExpectedTopology",
    "OutOfPlaceBreakError",
    "StaticInputMismatchError",
    "StaticInputProbe",
    "TensorIdentity",
    "TopologyMismatchError",
    "XpuBreakableGraphCapture",
    "XpuBreakableGraphWrapper",
    "all_reduce_into",
    "apply_breakable_graph_settings",
    "breakable_all_reduce",
    "breakable_graph_enabled",
    "configure_breakable_graph",
    "debug_checks_enabled",
    "device_graph_backend",
    "expected_topology_for",
    "first_difference",
    "graph_accounting",
    "platform_graph_backend",
    "preset_breakable_runner",
    "reachable_tensor_identities",
    "shared_capture_stream",
    "slot_mapping_representatives",
    "static_input_identities",
    "static_input_pointers",
    "static_input_probe",
    "xpu_laguna_series_active",
]
