"""An attempt that writes a partition with Publisher in two halves (pausing at a gate
between them, after touching `<gate>.half`), then publishes. Prints the outcome."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from corral.errors import StaleFenceError
from corral.sinks import MinRows, Publisher


def main() -> None:
    root, gate, rows = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    pub = Publisher("sales/day", root=root)
    fence = pub.writer.fence
    data = [{"id": i, "value": fence * 100 + i} for i in range(rows)]
    pub.stage()
    pub.write_rows("part-0.jsonl", data[: rows // 2])
    Path(f"{gate}.half").touch()
    while not gate.exists():
        time.sleep(0.02)
    pub.write_rows("part-1.jsonl", data[rows // 2 :])
    try:
        pub.publish(audits=[MinRows(rows)])
    except StaleFenceError as exc:
        print(f"refused: fence {exc.newer} holds it", flush=True)
        return
    print(f"published fence {fence}", flush=True)


if __name__ == "__main__":
    main()
