"""Folded stacks: where a night's CPU goes, per request, and its flame graph.

py-spy's ``--format raw`` (flamegraph.pl's input) writes one line per distinct stack:
``outer (file:line);...;leaf (file:line) <samples>``. Recorded with ``--gil`` (only the thread
holding the GIL is sampled), a sample is CPU spent in Python or in C called from it, never an
idle thread waiting on a queue or a selector: ``samples / rate`` is seconds of CPU.

Two nights of different sizes give the **marginal** CPU per request of each place (our module
file, else the package or stdlib module the leaf frame is in):
``(samples in the large night - in the small) / rate / (request difference)``. Imports and
start-up cancel, as in :func:`membersync.flows.benchmarks.cpu.marginal`.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from dataclasses import dataclass, field

Stacks = dict[tuple[str, ...], int]

# Our code, as py-spy names its files (relative to the sys.path entry they were found under).
OUR_FOLDERS = ("extract", "models", "flows", "warehouse")
NO_FRAME = "(no Python frame)"
_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def parse_folded(text: str) -> Stacks:
    """``frame;frame;... samples`` lines -> {stack (outermost first): samples}."""
    stacks: Stacks = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        stack, space, count = line.rstrip().rpartition(" ")
        if not space or not count.isdigit():
            raise ValueError(f"folded stacks, line {number}: expected 'frame;...;frame <samples>'")
        # py-spy writes the GIL's holder with no Python frame (a thread in C only) as an empty stack
        key = tuple(stack.strip().split(";")) if stack.strip() else (NO_FRAME,)
        stacks[key] = stacks.get(key, 0) + int(count)
    return stacks


def frame_file(frame: str) -> str:
    match = _FRAME.match(frame)
    return match.group("file") if match else frame


def is_ours(frame: str) -> bool:
    return frame_file(frame).split("/", 1)[0] in OUR_FOLDERS


def place(frame: str) -> str:
    """Where a frame's code lives: our module file (``extract/client.py``), else the package or
    stdlib module (``aiohttp``, ``asyncio``, ``selectors.py``)."""
    file = frame_file(frame)
    return file if is_ours(frame) else file.split("/", 1)[0]


def without_line(frame: str) -> str:
    """``f (file.py:12)`` -> ``f (file.py)``: one frame per function, whichever line sampled."""
    match = _FRAME.match(frame)
    return f"{match.group('name')} ({match.group('file')})" if match else frame


def self_samples(stacks: Stacks) -> Counter[str]:
    """Samples whose leaf frame is in each place."""
    out: Counter[str] = Counter()
    for stack, count in stacks.items():
        out[place(stack[-1])] += count
    return out


def inclusive_samples(stacks: Stacks) -> Counter[str]:
    """Samples with each function anywhere on the stack (counted once per stack)."""
    out: Counter[str] = Counter()
    for stack, count in stacks.items():
        for frame in {without_line(frame) for frame in stack}:
            out[frame] += count
    return out


@dataclass(frozen=True)
class Marginal:
    """The CPU per request that one place adds between a small and a large night."""

    place: str
    ms_per_request: float
    small_samples: int
    large_samples: int


def marginal(small: Counter[str], large: Counter[str], rate_hz: float, extra_requests: int) -> list[Marginal]:
    """Per place, ms of CPU per request: the samples the large night adds, over the requests it
    adds; largest first."""
    if extra_requests <= 0 or rate_hz <= 0:
        raise ValueError("the large night must send more requests than the small one")
    rows = [
        Marginal(
            name,
            1000.0 * (large.get(name, 0) - small.get(name, 0)) / rate_hz / extra_requests,
            small.get(name, 0),
            large.get(name, 0),
        )
        for name in set(small) | set(large)
    ]
    return sorted(rows, key=lambda row: (-row.ms_per_request, row.place))


@dataclass
class _Node:
    samples: int = 0
    children: dict[str, _Node] = field(default_factory=dict)


def _tree(stacks: Stacks) -> _Node:
    root = _Node()
    for stack, count in stacks.items():
        node = root
        node.samples += count
        for frame in stack:
            node = node.children.setdefault(without_line(frame), _Node())
            node.samples += count
    return root


def _colour(frame: str) -> str:
    if is_ours(frame):
        return "#6fa8dc"  # ours: blue
    return "#f6b26b"  # libraries and the standard library: orange


def _label(frame: str, width: float, char: float = 7.0) -> str:
    """The frame's name as far as it fits (about 7 px a character), or nothing in a sliver."""
    if width >= char * len(frame):
        return frame
    return frame[: int(width / char) - 2] + ".." if width >= 5 * char else ""


def flame_svg(stacks: Stacks, title: str, width: int = 1200, row: int = 16) -> str:
    """A flame graph (callers below, callees above, widths = samples; ours in blue), one
    ``<rect>`` with a ``<title>`` (function, samples, share) per function per call path."""
    root = _tree(stacks)
    total = root.samples or 1
    boxes: list[tuple[int, float, float, str, int]] = []  # depth, x, width, frame, samples

    def walk(node: _Node, depth: int, x: float) -> int:
        deepest = depth
        for name in sorted(node.children):
            child = node.children[name]
            w = width * child.samples / total
            boxes.append((depth, x, w, name, child.samples))
            deepest = max(deepest, walk(child, depth + 1, x))
            x += w
        return deepest

    depth = walk(root, 0, 0.0) + 1
    top = 24
    height = top + depth * row
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="11">',
        f'<text x="4" y="16">{html.escape(title)} ({total:,} samples)</text>',
    ]
    for level, x, w, name, samples in boxes:
        y = height - (level + 1) * row
        label = _label(name, w)
        parts.append(
            f"<g><title>{html.escape(name)}: {samples:,} samples, {100 * samples / total:.1f} %</title>"
            f'<rect x="{x:.2f}" y="{y}" width="{max(w - 0.5, 0.1):.2f}" height="{row - 1}" '
            f'fill="{_colour(name)}"/>'
            + (f'<text x="{x + 2:.2f}" y="{y + row - 4}">{html.escape(label)}</text>' if label else "")
            + "</g>"
        )
    parts.append("</svg>")
    return "\n".join(parts)
