# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The XPU Laguna series: exact speculative verify for Laguna on Intel XPU.

One package, one module per vLLM hook it serves: ``plugin`` (the entry points
vLLM loads), ``platform``, ``communicator``, ``attention`` (the FlashAttention
backend), ``model`` (the Laguna classes), ``options`` (its
``additional_config`` key), ``contract``, ``doctor`` and ``graphs`` (the
breakable XPU graphs). Importing this package imports nothing: the platform
probe imports ``kernels_check`` before torch is set up.
"""
