"""Shared by the parts of ``python -m tools.gpu_check.gpu_check``: the result rows, the report
that prints, saves and times them, and the tolerances of the correctness checks."""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

# Max abs error against the fp32 references. 16-bit runs feed bf16/fp16 operands to
# the tensor cores (P is rounded to 16 bits before P@V); outputs are O(1).
ATOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2.5e-2}


@dataclass
class Row:
    section: str
    case: str
    ours: str
    baseline: str = ""
    ratio: str = ""
    status: str = "ok"


class Report:
    def __init__(self, budget_s: float, json_path: str | None = None) -> None:
        self.rows: list[Row] = []
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.json_path = json_path
        self.environment = ""

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        # Progress on stderr, so a run cut short by a timeout still shows how far it got.
        print(
            f"[{time.perf_counter() - self.start:6.1f}s] {row.section} | {row.case} | {row.ours} | "
            f"{row.baseline} | {row.ratio} | {row.status}",
            file=sys.stderr,
            flush=True,
        )
        self.save()

    def save(self) -> None:
        """Rewrite the JSON after every row, so a killed run still leaves its rows."""
        if self.json_path:
            elapsed = time.perf_counter() - self.start
            with open(self.json_path, "w") as fh:
                json.dump(
                    {
                        "environment": self.environment,
                        "elapsed_s": elapsed,
                        "rows": [asdict(r) for r in self.rows],
                    },
                    fh,
                    indent=1,
                )

    def guard(self, section: str, case: str, fn: Callable[[], None]) -> None:
        """Run one check; an exception becomes an ERROR row instead of ending the script."""
        try:
            fn()
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            self.add(
                Row(section, case, f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}", status="ERROR")
            )

    def failed(self) -> bool:
        return any(r.status in ("FAIL", "ERROR") for r in self.rows)

    def table(self) -> str:
        head = ["section", "case", "ours", "baseline", "ratio", "status"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in self.rows:
            lines.append(f"| {r.section} | {r.case} | {r.ours} | {r.baseline} | {r.ratio} | {r.status} |")
        return "\n".join(lines)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
