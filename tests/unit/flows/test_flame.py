"""Folded stacks and flame graphs (benchmarks.cpu profile): where a night's CPU goes per request.

Truth is counted here by hand from the stacks each test writes; the last test samples a real
process with py-spy (the dev extras install it) to pin down the format it writes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
from membersync.flows.benchmarks import flame

FOLDED = textwrap.dedent(
    """\
    main (flows/benchmarks/sync.py:10);get (extract/client.py:467);fetch (aiohttp/client.py:700) 30
    main (flows/benchmarks/sync.py:10);get (extract/client.py:470);fetch (aiohttp/client.py:701) 10
    main (flows/benchmarks/sync.py:10);get (extract/client.py:480) 5
    main (flows/benchmarks/sync.py:10);type_row (models/coerce.py:90);loads (json/decoder.py:3) 15
    main (flows/benchmarks/sync.py:11);_run_once (asyncio/base_events.py:1900) 20
     4
    """
)


def test_case_folded_stacks_are_read_per_stack_and_placed_by_file() -> None:
    stacks = flame.parse_folded(FOLDED)
    assert sum(stacks.values()) == 84
    assert stacks[(flame.NO_FRAME,)] == 4  # py-spy's line for a GIL holder without Python frames
    assert flame.self_samples(stacks) == Counter(
        {"aiohttp": 40, "asyncio": 20, "json": 15, "extract/client.py": 5, flame.NO_FRAME: 4}
    )
    inclusive = flame.inclusive_samples(stacks)
    # A function counts once per stack, whichever of its lines was sampled.
    assert inclusive["get (extract/client.py)"] == 45
    assert inclusive["main (flows/benchmarks/sync.py)"] == 80
    assert inclusive["type_row (models/coerce.py)"] == 15


def test_case_a_malformed_folded_line_is_named() -> None:
    with pytest.raises(ValueError, match="line 2"):
        flame.parse_folded("a (x.py:1) 3\na (x.py:1) three\n")


def test_case_marginal_per_request_is_the_samples_a_night_adds_over_the_requests_it_adds() -> None:
    small = Counter({"aiohttp": 100, "extract/client.py": 40, "importlib": 300})
    large = Counter({"aiohttp": 400, "extract/client.py": 130, "importlib": 297, "yarl": 12})
    rate_hz, extra_requests = 250, 27_000
    rows = {row.place: row for row in flame.marginal(small, large, rate_hz, extra_requests)}

    def truth(added: int) -> float:  # ms: samples / (samples per s) / requests x 1000
        return float(Decimal(added) / Decimal(rate_hz) / Decimal(extra_requests) * 1000)

    assert rows["aiohttp"].ms_per_request == pytest.approx(truth(300), rel=1e-12)  # 0.0444 ms
    assert rows["yarl"].ms_per_request == pytest.approx(truth(12), rel=1e-12)
    assert rows["importlib"].ms_per_request < 0  # a fixed cost cancels (here, noise of -3 samples)
    assert next(iter(flame.marginal(small, large, rate_hz, extra_requests))).place == "aiohttp"
    with pytest.raises(ValueError):
        flame.marginal(small, large, rate_hz, 0)


def test_case_the_flame_graph_has_one_box_per_function_per_path_as_wide_as_its_samples() -> None:
    stacks = flame.parse_folded(FOLDED)
    width = 1000
    svg = ET.fromstring(flame.flame_svg(stacks, "a night", width=width))
    ns = "{http://www.w3.org/2000/svg}"
    boxes = {}
    for group in svg.iter(f"{ns}g"):
        title = group.find(f"{ns}title")
        rect = group.find(f"{ns}rect")
        assert title is not None and rect is not None
        name, _, rest = (title.text or "").rpartition(": ")
        boxes.setdefault(name, []).append((float(rect.get("width", "0")), rest, rect.get("fill")))
    # Paths: main > get > fetch, main > get, main > type_row > loads, main > _run_once, and the
    # frameless stack: main, get, fetch, type_row, loads, _run_once, (no Python frame) = 7 boxes.
    assert sum(len(v) for v in boxes.values()) == 7
    main_width, main_label, main_fill = boxes["main (flows/benchmarks/sync.py)"][0]
    assert main_label.startswith("80 samples")
    assert main_width == pytest.approx(width * 80 / 84, abs=0.6)  # 0.5 px gap between boxes
    fetch_width, _, fetch_fill = boxes["fetch (aiohttp/client.py)"][0]
    assert fetch_width == pytest.approx(width * 40 / 84, abs=0.6)
    assert main_fill != fetch_fill  # ours in one colour, libraries in another


def test_case_py_spy_with_gil_samples_the_busy_function_not_the_waiting_thread(tmp_path: Path) -> None:
    # Without --gil, py-spy took a night's idle executor thread, waiting on its queue, for 15 % of
    # the samples (measured): CPU that was never spent.
    script = tmp_path / "work.py"
    script.write_text(
        textwrap.dedent(
            """\
            import queue, threading, time

            work = queue.Queue()

            def wait_for_work():  # as an idle ThreadPoolExecutor worker does
                work.get()

            def burn_cpu():
                end = time.process_time() + 1.2
                while time.process_time() < end:
                    sum(range(1000))

            threading.Thread(target=wait_for_work, daemon=True).start()
            burn_cpu()
            """
        )
    )
    folded = tmp_path / "work.folded"
    spy = Path(sys.executable).with_name("py-spy")
    subprocess.run(
        [
            str(spy),
            "record",
            "--gil",
            "--format",
            "raw",
            "--rate",
            "100",
            "--output",
            str(folded),
            "--",
            sys.executable,
            str(script),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    stacks = flame.parse_folded(folded.read_text())
    inclusive = flame.inclusive_samples(stacks)
    total = sum(stacks.values())
    burning = sum(n for frame, n in inclusive.items() if frame.startswith("burn_cpu ("))
    assert total >= 50  # ~1.2 s of CPU at 100 samples a second, start-up aside
    assert burning / total >= 0.8
    assert not any(frame.startswith("wait_for_work (") for frame in inclusive)
