"""What parsing risky uploads in a child process costs (corpus.parse_worker): the example
PDF and HTML files parsed in place and through BoundedParser, alternating, after one cold
start of the parser's server process.

    python -m bench.parse_cost --out bench-results/parse-cost.json [--repeats 20]

Writes every timing; prints each file's medians and the median paired difference child - in
place, with 95% intervals (bench.stats).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.stats import fmt_interval, one_sample, paired_difference, sample_median
from bench.tables import markdown_table
from corpus.parse_worker import BoundedParser
from corpus.uploads import parse_upload
from harness.service import ROOT

FILES = (
    ("data/examples/lantern-festival.pdf", "application/pdf"),
    ("data/examples/kelp-farms.html", "text/html"),
)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    bounded = BoundedParser()
    files = [(Path(p).name, (ROOT / p).read_bytes(), kind) for p, kind in FILES]
    started = time.perf_counter()
    bounded(*files[0])
    records: dict = {"cold_start_ms": _ms(started), "files": {}}
    rows = []
    for name, content, kind in files:
        child, in_place = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            bounded(name, content, kind)
            child.append(_ms(started))
            started = time.perf_counter()
            parse_upload(name, content, kind)
            in_place.append(_ms(started))
        records["files"][name] = {"child_ms": child, "in_place_ms": in_place}
        difference = paired_difference(zip(child, in_place, strict=True), sample_median)
        rows.append(
            [name, *(fmt_interval(one_sample(t), 1) for t in (in_place, child)),
             fmt_interval(difference, 1)]
        )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(records, indent=2), encoding="utf-8")
    print(f"first parse, starting the parser's server process: {records['cold_start_ms']:.0f} ms")
    header = ["file", "in place ms, median", "child process ms, median", "child - in place, median"]
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
