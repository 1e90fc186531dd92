"""What a kernel's compiled code does that a convolution has no need to do, read from the PTX NVRTC makes of
its build (convsweep.device.compile): state kept in module-scope global memory (a memo outlives a launch there), a
clock read (a kernel that times itself can tell a warm-up from a timed pass), an L2 persistence or eviction
policy (a layer's input kept in L2 from one pass to the next), a launch from the device (work the timer's
streams may not wait for).

A finding is a fact on the record, not a verdict: a kernel may have a reason (a counter of its own, a
cache hint that is honest). The checks that make verdicts are convsweep.measure.integrity's; these tell a
reader where to look, in `query failures`, `query best` and the report.
"""
from __future__ import annotations

import re

FINDINGS = {
    "global_write": "writes module-scope global memory",
    "clock": "reads %globaltimer or %clock",
    "l2_policy": "sets an L2 persistence or eviction policy",
    "device_launch": "launches kernels from the device",
}

_FUNCTION = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)?(?P<kind>\.entry|\.func)\s+(?:\([^)]*\)\s*)?"
                       r"(?P<name>[A-Za-z_$][\w$]*)", re.M)
_MODULE_GLOBAL = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)?\.global\s+[^;]*?(?P<name>[A-Za-z_$][\w$]*)"
                            r"\s*(?:\[[^\]]*\])?\s*(?:=[^;]*)?;", re.M)
_CLOCK = re.compile(r"%(?:globaltimer(?:_lo|_hi)?|clock64|clock)\b")
_L2_POLICY = re.compile(r"\bcreatepolicy\b|evict_last|\bapplypriority\b|L2::cache_hint")
_DEVICE_LAUNCH = re.compile(r"\bcudaLaunchDevice(?:V2)?\b|\bcudaGetParameterBuffer(?:V2)?\b")
_CALL = re.compile(r"\bcall(?:\.uni)?\b[^;]*?(?:\(\s*[^)]*\)\s*,\s*)?(?P<name>[A-Za-z_$][\w$]*)\s*,?\s*(?:\(|;)")
_REGISTER = re.compile(r"%[A-Za-z_][\w]*")
_STORE = re.compile(r"^\s*(?:@!?%\w+\s+)?(?P<op>st|atom|red)(?P<mods>(?:\.[\w:]+)*)\s+(?:%\w+\s*,\s*)?"
                    r"\[(?P<address>[^\]]+)\]")
_DEFINE = re.compile(r"^\s*(?:@!?%\w+\s+)?(?P<op>[a-z][\w.:]*)\s+(?P<dst>%[\w]+)\s*,(?P<srcs>[^;]*);")


def _bodies(ptx: str) -> dict[str, tuple[str, str]]:
    """name -> (.entry or .func, its text up to the next function), for every function with a body."""
    found = {}
    matches = list(_FUNCTION.finditer(ptx))
    for m, after in zip(matches, matches[1:] + [None]):
        text = ptx[m.end(): after.start() if after else len(ptx)]
        if "{" in text.split(";")[0] or "{" in text[:200]:  # a declaration alone ends with ';' before any body
            found[m["name"]] = (m["kind"], text)
    return found


def _writes_global(body: str, symbols: set[str]) -> bool:
    """Whether a store or atomic of `body` writes through an address made from a module-scope symbol: taint
    follows every register defined from a symbol or a tainted register (twice over, for loops)."""
    if not symbols:
        return False
    tainted: set[str] = set()
    lines = body.splitlines()

    def names(text: str) -> set[str]:
        return set(_REGISTER.findall(text)) | {w for w in re.findall(r"[A-Za-z_$][\w$]*", text) if w in symbols}

    for _ in range(2):
        for line in lines:
            if m := _DEFINE.match(line):
                if not m["op"].startswith(("st", "atom", "red")) and names(m["srcs"]) & (tainted | symbols):
                    tainted.add(m["dst"])
    for line in lines:
        m = _STORE.match(line)
        if m is None or any(space in m["mods"] for space in (".shared", ".local", ".param", ".const")):
            continue
        if names(m["address"]) & (tainted | symbols):
            return True
    return False


def scan_ptx(ptx: str) -> dict[str, list[str]]:
    """Each kernel (.entry) of a module's PTX -> the FINDINGS keys its code, or a function it calls, shows."""
    symbols = {m["name"] for m in _MODULE_GLOBAL.finditer(_module_scope(ptx))}
    bodies = _bodies(ptx)
    own: dict[str, set[str]] = {}
    calls: dict[str, set[str]] = {}
    for name, (_, body) in bodies.items():
        keys = set()
        if _writes_global(body, symbols):
            keys.add("global_write")
        if _CLOCK.search(body):
            keys.add("clock")
        if _L2_POLICY.search(body):
            keys.add("l2_policy")
        if _DEVICE_LAUNCH.search(body):
            keys.add("device_launch")
        own[name] = keys
        calls[name] = {m["name"] for m in _CALL.finditer(body)} & set(bodies)
    found = {}
    for name, (kind, _) in bodies.items():
        if kind != ".entry":
            continue
        reached, todo = {name}, [name]
        while todo:
            for callee in calls.get(todo.pop(), ()):
                if callee not in reached:
                    reached.add(callee)
                    todo.append(callee)
        found[name] = sorted(set().union(*(own[f] for f in reached)), key=list(FINDINGS).index)
    return found


def _module_scope(ptx: str) -> str:
    """The PTX outside every function body: where module-scope variables are declared."""
    out, depth = [], 0
    for line in ptx.splitlines():
        if depth == 0:
            out.append(line)
        depth += line.count("{") - line.count("}")
    return "\n".join(out)


def describe(findings: dict[str, list[str]] | None, kernels=None) -> str:
    """One line for a table: 'kernel: what it does; ...' over `kernels` (all where None); '' for none."""
    parts = [f"{kernel}: {', '.join(FINDINGS[key] for key in keys)}" for kernel, keys in (findings or {}).items()
             if keys and (kernels is None or kernel in kernels)]
    return "; ".join(parts)
