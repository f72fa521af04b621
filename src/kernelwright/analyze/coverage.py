"""How much of a graph's work its generated kernels do (result.json's "analysis")."""
from __future__ import annotations


def coverage(graph, generated: set[str]) -> dict:
    """The anchor op and the shares of FLOPs and bytes that `generated` (the graph's nodes run by
    generated kernels) and the library compute, with the graph's roofline time."""
    if graph is None:
        return {"coverage": None}
    from kernelwright.analyze.classify import anchor

    out = {"anchor": anchor(graph.nodes)}
    try:
        from kernelwright.analyze import analyze, device_spec

        a = analyze(graph, device_spec())
        rows = {r["name"]: r for r in a.to_json()["nodes"]}
    except Exception as e:  # noqa: BLE001
        return {**out, "error": str(e)}
    tot_f = sum(r["flops"] for r in rows.values()) or 1
    tot_b = sum(r["bytes"] for r in rows.values()) or 1
    gen_f = sum(r["flops"] for n, r in rows.items() if n in generated)
    gen_b = sum(r["bytes"] for n, r in rows.items() if n in generated)
    return {**out, "coverage": {"generated_flops": gen_f / tot_f, "generated_bytes": gen_b / tot_b,
                         "library_flops": 1 - gen_f / tot_f, "library_bytes": 1 - gen_b / tot_b},
            "roofline_us": a.to_json().get("totals", {}).get("roofline_us")}


def generated_nodes(plan, rows: list[dict]) -> set[str]:
    """The graph nodes generated kernels compute: a row's id is a group id, a node name, or
    "group+gemm" (with prologue groups before it) for a fused GEMM."""
    if plan is None:
        return set()
    groups = {g.id: g for g in plan.groups}
    return {n for r in rows if r["strategy"] in ("triton", "cuda", "absorbed")
            for part in r["id"].split("+") for n in (groups[part].nodes if part in groups else [part])}


def captured_cost(graph) -> dict:
    """FLOPs and minimum bytes of a graph as captured (before the rewrites): analyze.cost.graph_cost."""
    from kernelwright.analyze.cost import graph_cost

    c = graph_cost(graph)
    return {"flops": c.flops, "bytes": c.bytes}


def plan_coverage(plan, rows: list[dict], captured: dict | None = None) -> dict:
    """coverage() of `plan`'s graph with the nodes its searched units' `rows` (result.json's "groups")
    run in generated kernels; a mode without a plan (its capture failed) has none. With `captured`
    (captured_cost of the graph before the rewrites), also `flops` and `bytes` as captured and
    `flops_after_rewrites` and `bytes_after_rewrites` of the planned graph."""
    out = coverage(plan.graph if plan else None, generated_nodes(plan, rows))
    if captured:
        out.update(flops=captured["flops"], bytes=captured["bytes"])
    if plan is not None:
        after = captured_cost(plan.graph)
        out.update(flops_after_rewrites=after["flops"], bytes_after_rewrites=after["bytes"])
    return out
