"""MXFP4 experts: de-quantized once at load (what ``inference.models.gpt_oss`` does) against
kept as blocks and de-quantized at each product (the memory-saving alternative, with no
MXFP4 kernel), in one process: ``python -m benchmarks.bench_mxfp4``.

One expert's ``gate_up`` product ``x[T, H] @ W[H, 2I]`` at gpt-oss-20b's width (H = 2880,
I = 2880) for a decode row (T = 1) and a prompt chunk (T = 64), fp32 on the CPU; prints
the seconds per product, the ratio, and the bytes each form holds. The GGUF layout
(``block_mxfp4``, what gpt-oss GGUF files hold) is timed as well: GGUF experts take the
same choice, de-quantized at load.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from inference.runner.mxfp4 import dequantize_blocks, dequantize_gguf


def _time(fn: object, repeat: int) -> float:
    fn()  # type: ignore[operator]
    start = time.perf_counter()
    for _ in range(repeat):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - start) / repeat


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2880)
    parser.add_argument("--intermediate", type=int, default=2880)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    h, out = args.hidden, 2 * args.intermediate
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (out, h // 32, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(118, 126, (out, h // 32), dtype=torch.uint8, generator=gen)
    weight = dequantize_blocks(blocks, scales).t().contiguous()  # [H, 2I], as loaded
    # The same values in GGUF's block_mxfp4 (scale byte, then element j low / j + 16 high).
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).flatten(-2)
    packed = (codes[..., :16] | (codes[..., 16:] << 4)).to(torch.uint8)
    gguf_rows = torch.cat((scales[..., None], packed), dim=-1).reshape(out, -1)
    assert torch.equal(dequantize_gguf(gguf_rows, h).t(), weight)
    print(f"gate_up of one expert, H={h}, 2I={out}, fp32, {torch.get_num_threads()} threads")
    print(
        f"  held: de-quantized {weight.numel() * 4 / 2**20:.1f} MiB, "
        f"blocks {(blocks.numel() + scales.numel()) / 2**20:.1f} MiB"
    )
    with torch.inference_mode():
        for tokens in (1, 64):
            x = torch.randn(tokens, h, generator=gen)
            loaded = _time(lambda x=x: x @ weight, args.repeat)
            per_call = _time(lambda x=x: x @ dequantize_blocks(blocks, scales).t(), args.repeat)
            per_call_gguf = _time(lambda x=x: x @ dequantize_gguf(gguf_rows, h).t(), args.repeat)
            print(
                f"  T={tokens:3d}: de-quantized at load {loaded * 1e3:8.2f} ms, at each product "
                f"{per_call * 1e3:8.2f} ms ({per_call / loaded:.1f}x slower); GGUF blocks at each "
                f"product {per_call_gguf * 1e3:8.2f} ms ({per_call_gguf / loaded:.1f}x slower)"
            )
    print(f"  load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
