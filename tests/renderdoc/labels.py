"""Checks the debug labels of a vkinfer RenderDoc capture (see capture.sh).

usage: labels.py CAPTURE.rdc FIRST_STEP LAST_STEP

Reads the capture's structured data (no replay, so no GPU is needed to check it), rebuilds the
label path of every vkCmdDispatch from the vkCmdBegin/EndDebugUtilsLabelEXT around it, and
asserts: only steps FIRST..LAST were captured; every dispatch sits inside "step N"; every layer
of every step has the projections' roles (attn_qkv, attn_o, ffn_gate_up, ffn_down: stories260K's
q|k|v and gate|up are concatenated at load) as "step N / layer L / role / kernel"; the LM head
and the sampler have theirs.
"""
import sys

import renderdoc as rd

ROLES = ["attn_qkv", "attn_o", "ffn_gate_up", "ffn_down"]


def label_name(chunk):
    """The pLabelName inside a vkCmdBeginDebugUtilsLabelEXT chunk."""
    todo = [chunk]
    while todo:
        obj = todo.pop()
        for i in range(obj.NumChildren()):
            child = obj.GetChild(i)
            if child.name == "pLabelName":
                return child.AsString()
            todo.append(child)
    raise SystemExit("FAIL: a label chunk without pLabelName")


def dispatch_paths(path):
    cap = rd.OpenCaptureFile()
    if cap.OpenFile(path, "", None) != rd.ResultCode.Succeeded:
        raise SystemExit(f"FAIL: RenderDoc cannot open {path}")
    stack, paths = [], []
    for chunk in cap.GetStructuredData().chunks:
        if chunk.name == "vkCmdBeginDebugUtilsLabelEXT":
            stack.append(label_name(chunk))
        elif chunk.name == "vkCmdEndDebugUtilsLabelEXT":
            if not stack:
                raise SystemExit("FAIL: a label ends that never began")
            stack.pop()
        elif chunk.name == "vkCmdDispatch":
            paths.append(" / ".join(stack))
    cap.Shutdown()
    return paths


def main():
    path, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    paths = dispatch_paths(path)
    if not paths:
        raise SystemExit("FAIL: no dispatch in the capture")
    steps = sorted({int(p.split(" / ")[0][5:]) for p in paths if p.startswith("step ")})
    if len([p for p in paths if not p.startswith("step ")]):
        raise SystemExit("FAIL: dispatches outside a step label: " + repr(paths[:3]))
    if steps != list(range(first, last + 1)):
        raise SystemExit(f"FAIL: captured steps {steps}, wanted {first}..{last}")
    layers = sorted({p.split(" / ")[1] for p in paths if p.split(" / ")[1].startswith("layer ")})
    missing = []
    for step in steps:
        for layer in layers:
            for role in ROLES:
                prefix = f"step {step} / {layer} / {role} / "
                if not any(p.startswith(prefix) for p in paths):
                    missing.append(prefix)
        for prefix in (f"step {step} / lm head / lm_head / ", f"step {step} / sample / "):
            if not any(p.startswith(prefix) for p in paths):
                missing.append(prefix)
    if missing or not layers:
        raise SystemExit(f"FAIL: no dispatch labelled {missing[:5]} (layers {layers})")
    print(f"ok: {len(paths)} dispatches in steps {first}-{last}, {len(layers)} layers, e.g. '{paths[len(paths) // 2]}'")


if __name__ == "__main__":
    main()
