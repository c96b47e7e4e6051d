"""An attempt that writes its rows to a FencedTable in two halves: the first half, then a
file `<gate>.half` to say so, then (once `<gate>` exists) the second half. It prints each
half's applied and refused counts. Used by the torn-partition tests."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from corral.sinks import FencedTable


def main() -> None:
    url, keys, gate = sys.argv[1], sys.argv[2].split(","), Path(sys.argv[3])
    fence = int(os.environ["CORRAL_FENCE"])
    table = FencedTable(url, "totals", key=["day"])
    half = len(keys) // 2
    for part, chunk in enumerate((keys[:half], keys[half:])):
        if part == 1:
            Path(f"{gate}.half").touch()
            while not gate.exists():
                time.sleep(0.02)
        result = table.upsert([{"day": k, "total": fence * 100} for k in chunk])
        print(f"applied={result.applied} refused={result.refused}", flush=True)


if __name__ == "__main__":
    main()
