# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The series' attention: the FlashAttention backend (``backend``), the exact
verify path (``exact``), its prebuilt metadata (``prebuilt``), the kernel
registry (``kernels``) and the KV split plan (``split_plan``)."""
