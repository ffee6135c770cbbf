"""The loops of a kernel's amdgcn assembly text, and what one iteration of
the hottest one issues (matrix instructions, memory operations, waits).
Build-time only; the text is triton's ``asm["amdgcn"]`` of one kernel.

The text is cut into basic blocks (at labels and after branches); a loop is
a back edge, a branch to a block that dominates it (its header), and its
body is every block that reaches the branch without passing the header (the
natural loop). This, rather than "from a label down to the branch that
jumps back to it", is needed because LLVM lays loops out freely: a rotated
loop's latch block sits above its header, and an outer loop's latch is
reached from the exits of its inner loops.

The hot loop is the innermost loop (one whose body holds no other loop's
header) with the most matrix instructions; among equals, the one with the
fewest instructions. The flash kernels have two innermost loops over the
K/V (or Q) blocks with the same dots: the full tiles without masking and
the boundary or causal tiles with it; at long sequence lengths nearly every
iteration is in the first, the leaner one.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

__all__ = ["LoopStats", "find_loops", "hot_loop", "hot_loop_stats", "hot_loop_lines", "loop_lines"]

_LABEL = re.compile(r"^([.$A-Za-z_][\w.$]*):")
_BRANCH = re.compile(r"^(s_cbranch_\w+|s_branch)\s+([.$A-Za-z_][\w.$]*)")
_ENDS = ("s_endpgm", "s_setpc_b64", "s_trap")  # no successor we can follow

# mnemonic prefix -> counter; the first matching prefix counts
_KINDS: Tuple[Tuple[str, str], ...] = (
    ("v_mfma", "mfma"), ("v_smfmac", "mfma"),
    ("v_wmma", "wmma"), ("v_swmmac", "wmma"),
    ("global_load", "global_loads"), ("buffer_load", "global_loads"), ("flat_load", "global_loads"),
    ("ds_read", "ds_reads"), ("ds_load", "ds_reads"),
    ("ds_write", "ds_writes"), ("ds_store", "ds_writes"),
    ("s_waitcnt", "waitcnt"),
    ("s_barrier", "barriers"),
)


@dataclass(frozen=True)
class LoopStats:
    """One natural loop: its header's label, depth (1 = outermost), how many
    blocks, and the instructions of its body by kind."""

    label: str
    depth: int
    blocks: int
    instructions: int = 0
    mfma: int = 0
    wmma: int = 0
    global_loads: int = 0
    ds_reads: int = 0
    ds_writes: int = 0
    waitcnt: int = 0
    barriers: int = 0
    innermost: bool = True
    # matrix instruction mnemonic -> count, e.g. {"v_mfma_f32_32x32x8_f16": 64}
    matrix_ops: Dict[str, int] = field(default_factory=dict)

    @property
    def matrix(self) -> int:
        return self.mfma + self.wmma


@dataclass
class _Block:
    label: Optional[str]
    mnemonics: List[str] = field(default_factory=list)
    lines: List[str] = field(default_factory=list)  # the code, comments included
    target: Optional[str] = None  # label branched to by the last instruction
    falls_through: bool = True


def _code(line: str) -> str:
    """The line without its comment and surrounding blanks."""
    return line.split(";", 1)[0].strip()


def _blocks(text: str) -> List[_Block]:
    blocks = [_Block(label=None)]
    for line in text.splitlines():
        code = _code(line)
        if not code:
            continue
        m = _LABEL.match(code)
        if m:
            if blocks[-1].mnemonics or blocks[-1].label is not None:
                blocks.append(_Block(label=m.group(1)))
            else:
                blocks[-1].label = m.group(1)
            continue
        if code.startswith("."):
            continue  # a directive
        mnemonic = code.split(None, 1)[0]
        cur = blocks[-1]
        cur.mnemonics.append(mnemonic)
        cur.lines.append(line.strip())
        b = _BRANCH.match(code)
        if b or mnemonic in _ENDS:
            cur.target = b.group(2) if b else None
            cur.falls_through = bool(b) and b.group(1) != "s_branch"
            blocks.append(_Block(label=None))
    return blocks


def _successors(blocks: Sequence[_Block]) -> List[List[int]]:
    index = {b.label: i for i, b in enumerate(blocks) if b.label is not None}
    succ: List[List[int]] = []
    for i, b in enumerate(blocks):
        s = []
        if b.target is not None and b.target in index:
            s.append(index[b.target])
        if b.falls_through and i + 1 < len(blocks):
            s.append(i + 1)
        succ.append(s)
    return succ


def _entry(blocks: Sequence[_Block]) -> Optional[int]:
    return next((i for i, b in enumerate(blocks) if b.mnemonics), None)


def _dominators(succ: Sequence[Sequence[int]], entry: int) -> Dict[int, FrozenSet[int]]:
    """Dominator sets of the blocks reachable from ``entry`` (iterative data flow)."""
    reach: List[int] = []
    seen = {entry}
    stack = [entry]
    while stack:
        n = stack.pop()
        reach.append(n)
        for s in succ[n]:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    preds: Dict[int, List[int]] = {n: [] for n in reach}
    for n in reach:
        for s in succ[n]:
            preds[s].append(n)
    everything = frozenset(reach)
    dom: Dict[int, FrozenSet[int]] = {n: everything for n in reach}
    dom[entry] = frozenset([entry])
    order = sorted(reach)
    changed = True
    while changed:
        changed = False
        for n in order:
            if n == entry:
                continue
            new = frozenset.intersection(*(dom[p] for p in preds[n])) | {n}
            if new != dom[n]:
                dom[n] = new
                changed = True
    return dom


def _natural_loops(succ: Sequence[Sequence[int]], dom: Dict[int, FrozenSet[int]]) -> Dict[int, Set[int]]:
    """Header -> body of every natural loop (back edges to one header merged)."""
    preds: Dict[int, List[int]] = {n: [] for n in dom}
    for n in dom:
        for s in succ[n]:
            preds[s].append(n)
    loops: Dict[int, Set[int]] = {}
    for n in dom:
        for h in succ[n]:
            if h in dom[n]:  # back edge n -> h
                body = loops.setdefault(h, {h})
                stack = [n]
                while stack:
                    x = stack.pop()
                    if x not in body:
                        body.add(x)
                        stack.extend(preds[x])
    return loops


def _count(blocks: Sequence[_Block], body: Set[int]) -> Dict[str, Any]:
    counts: Dict[str, Any] = {"instructions": 0}
    ops: Dict[str, int] = {}
    for i in body:
        for m in blocks[i].mnemonics:
            counts["instructions"] += 1
            for prefix, kind in _KINDS:
                if m.startswith(prefix):
                    counts[kind] = counts.get(kind, 0) + 1
                    if kind in ("mfma", "wmma"):
                        ops[m] = ops.get(m, 0) + 1
                    break
    counts["matrix_ops"] = dict(sorted(ops.items()))
    return counts


def _loops(text: str) -> Tuple[List[_Block], Dict[int, Set[int]]]:
    blocks = _blocks(text)
    entry = _entry(blocks)
    if entry is None:
        return blocks, {}
    succ = _successors(blocks)
    return blocks, _natural_loops(succ, _dominators(succ, entry))


def find_loops(text: str) -> List[LoopStats]:
    """Every loop of the assembly text, in the order of their headers."""
    blocks, loops = _loops(text)
    out = []
    for h in sorted(loops):
        body = loops[h]
        depth = sum(1 for other, ob in loops.items() if h in ob)
        innermost = not any(other != h and other in body for other in loops)
        out.append(LoopStats(label=blocks[h].label or f"block {h}", depth=depth, blocks=len(body),
                             innermost=innermost, **_count(blocks, body)))
    return out


def hot_loop(loops: Sequence[LoopStats]) -> Optional[LoopStats]:
    """The innermost loop with the most matrix instructions (then the fewest
    instructions, then the first); None without loops."""
    inner = [(i, lp) for i, lp in enumerate(loops) if lp.innermost]
    if not inner:
        return None
    return max(inner, key=lambda il: (il[1].matrix, -il[1].instructions, -il[0]))[1]


def hot_loop_stats(text: str) -> Optional[Dict[str, Any]]:
    """The compile-time record of the hot loop (stats["loop"]): its counts per
    iteration plus how many loops the kernel has; None if it has no loop."""
    loops = find_loops(text)
    hot = hot_loop(loops)
    if hot is None:
        return None
    d = asdict(hot)
    d.pop("innermost")
    d["loops"] = len(loops)
    return d


def loop_lines(text: str, loop: LoopStats) -> List[str]:
    """The code lines of ``loop``'s body (one of ``find_loops(text)``), in
    block order: a finer look at its instruction mix than LoopStats keeps."""
    blocks, loops = _loops(text)
    header = next(h for h, st in zip(sorted(loops), find_loops(text)) if st == loop)
    return [line for i in sorted(loops[header]) for line in blocks[i].lines]


def hot_loop_lines(text: str) -> List[str]:
    """The code lines of the hot loop's body; empty without a loop."""
    hot = hot_loop(find_loops(text))
    return [] if hot is None else loop_lines(text, hot)
