"""One prepared check for a GPU machine: ``python -m tools.gpu_check.gpu_check``.

Needs no network and no model files. Four parts, one table at the end:

1. correctness of every Triton kernel against the PyTorch references
   (``tools.gpu_check.gpu_check_kernels``);
2. kernel timings against PyTorch (``tools.gpu_check.gpu_check_bench``);
3. the engine on random weights: greedy tokens with CUDA graphs against eager ones, then
   throughput eager and with CUDA graphs (``tools.gpu_check.gpu_check_engine``). This part is
   guarded: if the engine cannot be imported or fails, the kernel rows still print;
4. one row per model family of the shared Llama decoder (Qwen3, Qwen3-MoE, Phi-3, OLMo 2,
   Granite, SmolLM3) on random weights of its real shapes: greedy tokens, eager and with CUDA
   graphs, against transformers (``tools.gpu_check.gpu_check_families``);
5. one row per sliding-window family (Mistral, Gemma 3, gpt-oss) on random weights of its real
   shapes: greedy tokens against transformers past a 32-token window, and the KV pages the
   longest sequence held (``tools.gpu_check.gpu_check_sliding``).

Rows and the report are in ``tools.gpu_check.gpu_check_common``. Everything is budgeted to fit
in 10 minutes (``--budget-s``). Exit status: 0 all checks passed, 1 a check failed, 2 no
CUDA device. ``--cpu-smoke`` runs the correctness part under the Triton interpreter on
CPU with tiny shapes, and the engine part on a tiny CPU model: it checks this script, not
the GPU. A tool, never imported by the runtime.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import signal
import sys
import time
from typing import Any

import torch

from tools.gpu_check.gpu_check_bench import bench_kernels
from tools.gpu_check.gpu_check_common import Report, Row
from tools.gpu_check.gpu_check_engine import bench_engine
from tools.gpu_check.gpu_check_families import check_families
from tools.gpu_check.gpu_check_kernels import check_correctness
from tools.gpu_check.gpu_check_sliding import check_sliding_families

# ---- main ------------------------------------------------------------------------------------


def environment(device: torch.device) -> str:
    import triton

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (Triton interpreter)"
    cuda = torch.version.cuda or "-"
    return (
        f"{dt.datetime.now().isoformat(timespec='seconds')} | {gpu} | torch {torch.__version__} | "
        f"triton {triton.__version__} | CUDA {cuda}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting new work after this")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--skip-families", action="store_true")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="no GPU: run the correctness part under the Triton interpreter (tiny shapes) "
        "and the engine part on a tiny CPU model, to check this script",
    )
    args = parser.parse_args(argv)

    if args.cpu_smoke:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("--cpu-smoke: triton was imported before TRITON_INTERPRET=1 could be set", file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are first decorated
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False). Run it on a GPU "
            "machine, or use --cpu-smoke to check the script under the Triton interpreter.",
            file=sys.stderr,
        )
        return 2
    else:
        device = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 references must stay fp32

    rep = Report(args.budget_s, args.json)
    header = rep.environment = environment(device)
    print(header, file=sys.stderr, flush=True)

    def out_of_time(signum: int, frame: Any) -> None:
        raise TimeoutError("gpu_check budget exhausted")

    if hasattr(signal, "SIGALRM"):
        # A hung or slow step becomes an ERROR row (and later parts skip), and the
        # table is still printed before an outer time limit kills the process.
        signal.signal(signal.SIGALRM, out_of_time)
        signal.alarm(int(args.budget_s) + 20)
    dtypes = [torch.float32, torch.bfloat16] if args.cpu_smoke else [torch.bfloat16, torch.float16]
    try:
        check_correctness(rep, device, dtypes, tiny=args.cpu_smoke)
        if not args.skip_timing and device.type == "cuda":
            bench_kernels(rep, device)
        if not args.skip_engine:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()  # give the engine's KV sizing the memory the benchmarks held
            bench_engine(rep, device, tiny=args.cpu_smoke)
        if not args.skip_families:
            check_families(rep, device, tiny=args.cpu_smoke)
            check_sliding_families(rep, device, tiny=args.cpu_smoke)
    except TimeoutError as exc:  # raised between guarded checks
        rep.add(Row("run", "time budget", str(exc), status="ERROR"))
    finally:
        if hasattr(signal, "SIGALRM"):
            signal.alarm(0)

    elapsed = time.perf_counter() - rep.start
    print(f"\n{header} | {elapsed:.0f}s\n")
    print(rep.table())
    rep.save()
    return 1 if rep.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
