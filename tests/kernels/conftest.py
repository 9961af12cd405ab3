"""Kernel tests: Triton kernels against the PyTorch references.

Without a GPU the kernels run under Triton's interpreter on CPU tensors. The
interpreter is chosen by ``TRITON_INTERPRET`` when ``@triton.jit`` runs, i.e.
when a kernel module is first imported, so it is set here at conftest import,
before any test module imports ``chatsite_kernels.triton.ops``. On a CUDA machine the
variable is left alone: these tests then run the compiled kernels, and the
engine tests in the same process keep their real (compiled) Triton.
"""

from __future__ import annotations

import importlib.util
import os

import torch

# Without triton installed (the engine's CPU path does not need it) the test modules
# skip themselves visibly through pytest.importorskip.
if importlib.util.find_spec("triton") is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
