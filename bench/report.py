"""BENCHMARKS.md from the JSON result files of a results directory.

The report is rebuilt from whatever results exist, so a partial or resumed run still yields a
complete page, with missing sections said to be missing rather than silently left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import prototypes
from bench.common import scale_label

SECTION_TITLES = {
    "query": "Query latency and exactness (engine level, in-process)",
    "save": "Save -> searchable",
    "ingest": "Ingest (Go2 rates)",
    "footprint": "Footprint and start-up",
    "peers": "Peers on the same workload",
    "limit": "Limit line (memory bandwidth)",
    "embed": "Query embedding cost (excluded from engine-level query figures)",
    "prototypes": "Prototyped fixes for core (before/after)",
    "ros": "ROS round trip (/memory/search)",
    "index": "Index layer: background graphs, time order, checksummed cache",
    "tf_load": "TF load: poses under a real robot's /tf (issue 16)",
}


def _load(out: Path) -> dict[str, Any]:
    res = {}
    for p in sorted(out.glob("*.json")):
        try:
            res[p.stem] = json.loads(p.read_text())
        except ValueError:
            continue
    return res


def _by_prefix(res: dict[str, Any], prefix: str) -> list[tuple[str, dict[str, Any]]]:
    items = [(k, v) for k, v in res.items() if k.startswith(prefix + "_")]
    return sorted(items, key=lambda kv: kv[1].get("params", {}).get("n", 0))


def _f(x: Any, nd: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _prev(p: dict[str, Any] | None) -> str:
    """The previous release's start on the same store (footprint `--before`)."""
    return "–" if not p else f"{p['open_s']} + {p['first_query_ms']}"


def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def bars(res: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(bar, target, measured, verdict) for every bar of the issue that a result speaks to."""
    rows: list[tuple[str, str, str, str]] = []

    def q(n: int) -> dict[str, Any] | None:
        v = res.get(f"query_{scale_label(n)}")
        return v if v and "kinds" in v else None

    def verdict(ok: bool | None) -> str:
        return "not measured" if ok is None else ("met" if ok else "**missed**")

    def fixed(n: int, kind: str) -> dict[str, Any] | None:
        v = res.get(f"prototypes_{scale_label(n)}")
        a = (v or {}).get("kinds", {}).get(kind, {}).get("after")
        return {"latency_ms": a["latency_ms"], "exact_fraction": a["exact_fraction"],
                "recall_at_k": None} if a else None

    for n, comb_p50, comb_p99, sem_p50 in ((100_000, 0.5, 2.0, 2.0), (1_000_000, 5.0, None, 8.0)):
        for variant in ("as is", "with prototyped fixes") if prototypes.pending() else ("as is",):
            _bar_rows(rows, n, comb_p50, comb_p99, sem_p50, variant,
                      q(n) if variant == "as is" else (
                          {"kinds": {k: fixed(n, k) for k in ("combined", "semantic")}}
                          if fixed(n, "combined") else None), verdict, q(n))
    _rest_bars(rows, res, verdict)
    return rows


def _bar_rows(rows: list, n: int, comb_p50: float, comb_p99: float | None, sem_p50: float,
              variant: str, r: dict[str, Any] | None, verdict: Any,
              base: dict[str, Any] | None) -> None:
    """The latency/exactness bars of one scale for the engine as is or with the fixes."""
    lab = f"{scale_label(n)} ({variant})"
    c = r["kinds"]["combined"] if r else None
    s = r["kinds"]["semantic"] if r else None
    rows.append((f"{lab} combined p50", f"≤ {comb_p50} ms",
                 _f(c["latency_ms"]["p50"]) + " ms" if c else "–",
                 verdict(c["latency_ms"]["p50"] <= comb_p50 if c else None)))
    if comb_p99 is not None:
        rows.append((f"{lab} combined p99", f"≤ {comb_p99} ms",
                     _f(c["latency_ms"]["p99"]) + " ms" if c else "–",
                     verdict(c["latency_ms"]["p99"] <= comb_p99 if c else None)))
        rows.append((f"{lab} combined exact", "100% of queries",
                     _pct(c["exact_fraction"]) if c else "–",
                     verdict(c["exact_fraction"] >= 1.0 if c else None)))
    rows.append((f"{lab} semantic-only p50", f"≤ {sem_p50} ms",
                 _f(s["latency_ms"]["p50"]) + " ms" if s else "–",
                 verdict(s["latency_ms"]["p50"] <= sem_p50 if s else None)))
    if variant == "as is":  # the fixes do not touch the index: recall is the same
        s2 = base["kinds"]["semantic"] if base else None
        rows.append((f"{scale_label(n)} semantic-only recall@5", "≥ 0.99",
                     _f(s2["recall_at_k"]) if s2 else "–",
                     verdict(s2["recall_at_k"] >= 0.99 if s2 else None)))


def _rest_bars(rows: list, res: dict[str, Any], verdict: Any) -> None:
    ros = res.get("ros")
    if ros and "combined" in ros:
        p = ros["combined"]["round_trip_ms"]["p50"]
        fx = (ros.get("variants") or {}).get("fixed", {}).get("combined")
        extra = f"; {fx['round_trip_ms']['p50']:.3f} ms with the prototyped fixes" if fx else ""
        rows.append(("100k combined via /memory/search p50", "≤ 3 ms",
                     f"{p:.3f} ms as is{extra}", verdict(p <= 3.0)))
    else:
        why = (ros or {}).get("skipped") or (ros or {}).get("error") or "not run"
        rows.append(("100k combined via /memory/search p50", "≤ 3 ms", why, "not measured"))
    sv = res.get("save")
    if sv and "save_to_found_ms" in sv:
        p = sv["save_to_found_ms"]["p50"]
        fx = (sv.get("variants") or {}).get("fixed")
        extra = f"; {fx['save_to_found_ms']['p50']:.2f} ms with the prototyped fixes" if fx else ""
        rows.append(("save -> searchable p50 (embedding included)", "≤ 20 ms",
                     f"{p:.2f} ms as is{extra}", verdict(p <= 20.0)))
    for key, r in _by_prefix(res, "query"):
        # Recall on other vectors than the default at a scale (harder data): recall@10 is the
        # sweep's at the graph's setting in use.
        if "kinds" not in r or key.count("_") < 2:
            continue
        s = r["kinds"]["semantic"]
        used = [e for e in r.get("ef_sweep") or [] if "recall_at_10" in e
                and e["m"] == r["index"]["hnsw_m"]
                and e["ef_search"] in (r["index"].get("effective_ef_search") or {}).values()]
        r10 = f", recall@10 {_f(used[0]['recall_at_10'])}" if used else ""
        rows.append((f"{scale_label(r['n'])} ({r['vectors']}) semantic-only recall@5", "≥ 0.99",
                     f"{_f(s['recall_at_k'])}{r10} (p50 {_f(s['latency_ms']['p50'])} ms)",
                     verdict(s["recall_at_k"] >= 0.99)))
    for _key, f in _by_prefix(res, "footprint"):
        split = f.get("rss_per_100k_split_mb") or {}
        ready = split.get("graphs_ready")
        lab = scale_label(f["n"]) if "n" in f else "?"
        if ready:
            rows.append((f"{lab} RSS per 100k rows held by the process (anon), graph read",
                         "≤ 120 MB", f"{ready['anon']} MB (+{ready['file']} MB of mapped file "
                         "pages the OS can drop)", verdict(ready["anon"] <= 120)))
        if "disk_per_100k_mb" in f:
            rows.append((f"{lab} disk per 100k rows", "≤ 250 MB", f"{f['disk_per_100k_mb']} MB",
                         verdict(f["disk_per_100k_mb"] <= 250)))
        start = (f.get("start_cache_load") or {}).get("open_and_first_query_s")
        if f.get("n") == 1_000_000 and start is not None:
            rows.append(("1M open + first query (the cache present)", "≤ 3 s", f"{start} s",
                         verdict(start <= 3.0)))
    for _key, pr in _by_prefix(res, "peers"):
        ours = pr.get("ours", {}).get("semantic")
        for peer, v in pr.get("peers", {}).items():
            sem = v.get("kinds", {}).get("semantic")
            if sem and ours:
                rows.append((f"{peer} slower on semantic-only ({scale_label(pr['n'])})",
                             "ratio > 1, ours recall@5 ≥ 0.99",
                             f"{sem['ratio_p50']}x p50 ({_f(sem['latency_ms']['p50'], 2)} ms vs "
                             f"ours {_f(ours['latency_ms']['p50'], 2)} ms); recall@5 "
                             f"{_f(sem['recall_at_k'])} vs ours "
                             f"{_f(ours.get('recall_at_k'))}",
                             verdict(sem["ratio_p50"] > 1.0
                                     and (ours.get("recall_at_k") or 0) >= 0.99)))
            c = v.get("kinds", {}).get("combined")
            if c:
                rows.append((f"{peer} slower on combined ({scale_label(pr['n'])})",
                             "ratio > 1", f"{c['ratio_p50']}x p50 (engine as is); "
                             f"{c.get('ratio_p50_fixed', '–')}x with the prototyped fixes",
                             verdict(c["ratio_p50"] > 1.0)))


def write_report(out: Path, report: Path) -> None:
    res = _load(out)
    run = res.get("run", {})
    m = run.get("machine", {})
    L: list[str] = []
    add = L.append
    add("# Benchmarks")
    add("")
    add("Generated by `python -m bench` (bench/); do not edit by hand. Results as JSON under "
        "`bench/results/`, raw latencies and profiles under `bench/results/raw/` (not kept in "
        "git).")
    add("")
    add("Run: `.venv/bin/python -m bench` (everything: 10k, 100k, 1M; peers at 100k in "
        "`bench/.venv-peers`, created on first use), `--quick` (2k rows, no peers, seconds), "
        "`--scales 10k,100k`, `--only query,peers`, `--resume` (keep finished sections; reuse "
        "peers' raw answers). Generated stores are cached in `bench/.cache/`.")
    add("")
    add(f"- Last command: `{' '.join(run.get('argv', ['?']))}`, started "
        f"{run.get('started', '?')}")
    add(f"- Machine: {m.get('cpu', '?')}, {m.get('cpus', '?')} CPUs, {m.get('mem_gb', '?')} GB, "
        f"Python {m.get('python', '?')}; load average at start {m.get('loadavg', '?')}; "
        f"OPENBLAS env {m.get('openblas_env') or 'unset'}")
    add("- Figures are single queries, one at a time, on a shared 2-core machine: other work "
        "ran at the same time, so treat them as preliminary and compare within a run.")
    add("")
    add("## Workload")
    add("")
    add("One robot over three days: 12 working hours a day, one trajectory (a smooth random "
        "walk at ~0.4 m/s) in a 50 m x 50 m area, rows in streams camera 35% / lidar 25% / "
        "odom 35% / events 5%, times increasing; every row has a 384-d unit vector. Up to 100k "
        "rows the vectors are MiniLM (all-MiniLM-L6-v2 int8) embeddings of generated captions "
        "(describer-like camera text, scan and odometry summaries, notes); at 1M they are "
        "synthetic (1024 clustered topics on a 32-d latent manifold plus noise). Queries: "
        "stream-only (newest first), near-only (3 m radius, newest first), time-only (last 6 h, "
        "newest first), semantic-only (k=5 over every stream) and combined (camera + 3 m + last "
        "6 h + semantic, k=5). Near points lie on the last 6 h of trajectory, offset ~0.7 m. "
        "*Exact* means the result equals a brute-force ranking of every row passing the "
        "filters (ties within float32 rounding may swap). Engine-level figures call "
        "`MemoryEngine.search(json)` (JSON in and out) with a lookup embedder, so query "
        "embedding is excluded there and measured on its own.")
    add("")
    add("## Bars")
    add("")
    add("| bar | target | measured | verdict |")
    add("|---|---|---|---|")
    for b in bars(res):
        add("| " + " | ".join(b) + " |")
    add("")

    # ---- query ---------------------------------------------------------------------------
    add("## " + SECTION_TITLES["query"])
    add("")
    lim = res.get("limit", {})
    bw = lim.get("copy_bandwidth_gb_s")
    qs = _by_prefix(res, "query")
    if not qs:
        add("Not run.")
    else:
        add("| rows | query | p50 ms | p99 ms | exact | recall@5 | candidates p50 | "
            "bandwidth limit ms | typed run_search p50 ms |")
        add("|---|---|---|---|---|---|---|---|---|")
        for _key, r in qs:
            if "kinds" not in r:
                add(f"| {scale_label(r['params']['n'])} | error: {r.get('error')} |")
                continue
            for kind, v in r["kinds"].items():
                cands = v["candidates"]["p50"]
                lim_ms = (cands * 384 * 4 / (bw * 1e9) * 1000
                          if bw and kind in ("semantic", "combined") else None)
                typed = v.get("typed_run_search_ms")
                add(f"| {scale_label(r['n'])} ({r['vectors']}) | {kind} | "
                    f"{_f(v['latency_ms']['p50'])} | {_f(v['latency_ms']['p99'])} | "
                    f"{_pct(v['exact_fraction'])} | {_f(v['recall_at_k'])} | {_f(cands, 0)} | "
                    f"{_f(lim_ms, 4)} | {_f(typed['p50']) if typed else '–'} |")
        add("")
        for _key, r in qs:
            if "index" in r:
                ix = r["index"]
                bf = r.get("brute_force_matvec_ms", {})
                eff = ix.get("effective_ef_search") or {}
                eff_txt = ", ".join(f"{k} {'exact' if v is None else v}" for k, v in eff.items())
                add(f"- {scale_label(r['n'])}: index {ix['kind']}; HNSW M={ix['hnsw_m']}, "
                    f"efConstruction={ix['ef_construction']}, efSearch={ix['ef_search']} "
                    f"configured ({eff_txt or 'no graphs'} in use), "
                    f"graph from {ix['hnsw_min_rows']} rows "
                    f"{'per model' if 'per model' in ix['kind'] else 'per stream'}; "
                    "brute-force mat-vec + "
                    f"top-k over all rows p50 {_f(bf.get('p50'))} ms; {r['queries_per_kind']} "
                    f"queries per kind; section {r.get('wall_s')} s.")
        add("")
        _sweep_table(add, qs)
        add("*Bandwidth limit*: the time to stream the candidate vectors (p50 count x 1536 "
            "bytes) once at the measured copy bandwidth; semantic-only candidates are every "
            "row, which an index avoids reading.")
        add("")

    # ---- profiles ----------------------------------------------------------------------------
    if qs:
        add("### Where the time goes (cProfile over up to 50 queries of a kind: the project's "
            "functions by cumulative time, then the top built-ins by own time)")
        add("")
        _key, r = qs[-1]
        for kind in ("combined", "semantic", "time"):
            v = r.get("kinds", {}).get(kind)
            if not v:
                continue
            add(f"{scale_label(r['n'])} {kind}:")
            add("")
            add("| function | calls | own ms | cumulative ms |")
            add("|---|---|---|---|")
            for p in v["profile_top"]:
                add(f"| `{p['func']}` | {p['calls']} | {p['tottime_ms']} | {p['cumtime_ms']} |")
            add("")

    # ---- prototypes ---------------------------------------------------------------------------
    add("## " + SECTION_TITLES["prototypes"])
    add("")
    ps = _by_prefix(res, "prototypes")
    if not ps:
        add("Not run.")
    else:
        first = ps[0][1]
        for name, desc in first.get("fixes", {}).items():
            add(f"- **{name}**: {desc}")
        add("")
        add("| rows | query | before p50 / p99 ms | after p50 / p99 ms | exact after |")
        add("|---|---|---|---|---|")
        for _key, r in ps:
            for kind, v in r.get("kinds", {}).items():
                b, a = v.get("before"), v.get("after")
                if not (b and a):
                    continue
                add(f"| {scale_label(r['n'])} | {kind} | {_f(b['latency_ms']['p50'])} / "
                    f"{_f(b['latency_ms']['p99'])} | {_f(a['latency_ms']['p50'])} / "
                    f"{_f(a['latency_ms']['p99'])} | {_pct(a['exact_fraction'])} |")
        add("")

    # ---- embed / save --------------------------------------------------------------------------
    add("## " + SECTION_TITLES["embed"])
    add("")
    e = res.get("embed")
    if e and "one_query_ms" in e:
        add(f"{e['model']}, {e['onnx_threads']} ONNX thread: one query p50 "
            f"{_f(e['one_query_ms']['p50'], 2)} ms, p99 {_f(e['one_query_ms']['p99'], 2)} ms "
            f"(model load {e['load_s']} s). The engine caches the last 512 query vectors.")
    else:
        add("Not run." if not e else f"Error: {e.get('error')}")
    add("")
    add("## " + SECTION_TITLES["save"])
    add("")
    s = res.get("save")
    if s and "save_to_found_ms" in s:
        add(f"On a copy of the {scale_label(s['n'])} store, MiniLM embedding included, "
            "Markdown append + fsync included; *found* = a semantic search for the note's own "
            "text (stream events, k=5) returns its id.")
        add("")
        add("| engine | measure | p50 ms | p99 ms |")
        add("|---|---|---|---|")
        variants = s.get("variants") or {"as_is": s}
        for label, v in variants.items():
            name = {"as_is": "as is", "fixed": "with prototyped fixes + query-cache seeding"}
            for k, lab in (("save_call_ms", "save() call"),
                           ("return_to_found_ms", "save returned -> found"),
                           ("save_to_found_ms", "save called -> found")):
                add(f"| {name.get(label, label)} | {lab} | {_f(v[k]['p50'], 2)} | "
                    f"{_f(v[k]['p99'], 2)} |")
        add("")
        for label, v in variants.items():
            add(f"- {label}: sustained {v['sustained_saves_per_s']} saves/s over "
                f"{v['sustain_s']} s; notes not found within 2 s: {v['not_found_within_2s']}.")
    else:
        add("Not run." if not s else f"Error: {s.get('error')}")
    add("")

    # ---- ingest --------------------------------------------------------------------------------
    add("## " + SECTION_TITLES["ingest"])
    add("")
    ing = res.get("ingest")
    if ing and "rates" in ing:
        add("Engine level: messages generated at camera 14 Hz, lidar 8 Hz, odometry 19 Hz times "
            "the rate; keyframe gate 0.5 m / 0.5 rad / 10 s; queue 16; camera batches of 4 "
            "described (OpenCV heuristic describer on 640x480 frames) and embedded (MiniLM, 1 "
            f"thread); robot at 0.8 m/s; {ing['seconds']} s per rate.")
        add("")
        add("| rate | received/s (cam, lidar, odom) | kept/s | described/s | embedded/s | "
            "dropped | CPU % | peak RSS MB |")
        add("|---|---|---|---|---|---|---|---|")
        for rate, r in ing["rates"].items():
            rc = r["received_per_s"]
            add(f"| {rate}x | {rc['camera']}, {rc['lidar']}, {rc['odom']} | {r['kept_per_s']} | "
                f"{r['described_per_s']} | {r['embedded_per_s']} | {r['dropped']} | "
                f"{r['cpu_percent']} | {r['rss_peak_mb']} |")
        add("")
        ros_ing = ing.get("ros") or {}
        if "rates" in ros_ing:
            add(f"ROS: `memory_node.ros.recorder` (own process, use_sim_time) fed by "
                f"`memory-replay` of the sample Go2-like bag ({ros_ing['bag_duration_s']:.0f} s "
                "of bag: camera 12 Hz, lidar 8 Hz, odometry 20 Hz, TF); counters are the "
                "recorder's own; described/embedded per second of processing (replay + drain).")
            add("")
            add("| rate | received / in bag (cam, lidar, odom) | replay wall s | "
                "kept (cam, lidar, odom) | described/s | dropped (cam, lidar, odom) | failed | "
                "processing s | CPU % | peak RSS MB |")
            add("|---|---|---|---|---|---|---|---|---|---|")
            for rate, r in ros_ing["rates"].items():
                if "error" in r:
                    add(f"| {rate}x | error: {r['error']} |||||||||")
                    continue
                rc, ib, kp, dr = r["received"], r["in_bag"], r["kept"], r["dropped"]
                add(f"| {rate}x | {rc['camera']}/{ib['camera']}, {rc['lidar']}/{ib['lidar']}, "
                    f"{rc['odom']}/{ib['odom']} | {r['replay_s']} | "
                    f"{kp['camera']}, {kp['lidar']}, {kp['odom']} | {r['described_per_s']} | "
                    f"{dr['camera']}, {dr['lidar']}, {dr['odom']} | "
                    f"{sum(r['failed'].values())} | {r['processing_s']} | {r['cpu_percent']} | "
                    f"{r['rss_peak_mb']} |")
        else:
            add("ROS part (recorder + bag replay): " + str(
                ros_ing.get("skipped") or ros_ing.get("error") or "not run"))
    else:
        add("Not run." if not ing else f"Error: {ing.get('error')}")
    add("")

    # ---- footprint -------------------------------------------------------------------------------
    add("## " + SECTION_TITLES["footprint"])
    add("")
    fs = _by_prefix(res, "footprint")
    for p in sorted((out / "history").glob("footprint_*_before_*.json")):
        # Kept from the release before mapped arrays (another store build, another run).
        fs.append((p.stem, {**json.loads(p.read_text()),
                            "_label": f"previous release ({p.stem.split('_before_')[1]}, "
                                      "earlier run)"}))
    fs.sort(key=lambda kv: kv[1].get("params", {}).get("n", 0))
    if fs:
        add("| rows | vectors | code | disk db MB | disk index MB | disk per 100k MB | RSS per "
            "100k MB, graphs read: total (anon / file) | RSS per 100k MB, first queries exact: "
            "total (anon / file) | open + first query s | graphs read after s | first query "
            "ms, graphs read | previous release on the same store: open s + first query ms | "
            "start (rebuild) s |")
        add("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for _k, f in fs:
            if "start_cache_load" not in f:
                add(f"| {scale_label(f['params']['n'])} | error: {f.get('error')} |")
                continue
            now, ready = f["start_cache_load"], f.get("start_graphs_ready")
            logged = f["start_rebuild"].get("from_build_log")
            rebuild = f"{f['start_rebuild']['open_s']}{' (from build.json)' if logged else ''}"
            vec = f.get("params", {}).get("vectors", "–")
            if "rss_per_100k_split_mb" not in f:  # a result of the release before mapped arrays
                add(f"| {scale_label(f['n'])} | {vec} | "
                    f"{f.get('_label', 'previous release (earlier run)')} | "
                    f"{f['disk_db_mb']} | {f['disk_index_mb']} | {f['disk_per_100k_mb']} | "
                    f"{f['rss_per_100k_mb']} (not split) | – | "
                    f"{now['open_s'] + now['first_query_ms'] / 1000:.3f} | – | – | – | "
                    f"{rebuild} |")
                continue
            split = f["rss_per_100k_split_mb"]

            def kinds(d: dict[str, float] | None) -> str:
                return "– (no graph cached)" if d is None else \
                    f"{d['total']} ({d['anon']} / {d['file']})"

            exact = " (exact, noted)" if now.get("first_query_notes") else ""
            prev = f.get("start_before")
            add(f"| {scale_label(f['n'])} | {vec} | this release | {f['disk_db_mb']} | "
                f"{f['disk_index_mb']} | {f['disk_per_100k_mb']} | "
                f"{kinds(split['graphs_ready'])} | {kinds(split['first_query_exact'])} | "
                f"{now['open_and_first_query_s']}{exact} | "
                f"{ready['graphs_ready_s'] if ready else '– (none cached)'} | "
                f"{ready['first_query_ms'] if ready else '–'} | "
                f"{_prev(prev)} | {rebuild} |")
        add("")
        split_rows = [(k, f) for k, f in fs if f.get("disk_parts_per_100k_mb")]
        if split_rows:
            add("Disk per 100k rows, by part (MB allocated):")
            add("")
            labels = {"db_vectors": "memory.db: vectors table", "db_rest": "memory.db: the rest",
                      "vector_files": "vector files", "cache_vectors": "cache: vectors",
                      "cache_ids_meta": "cache: ids, slots, times, places",
                      "cache_graphs": "cache: graphs"}
            labels = {k: v for k, v in labels.items()  # a part no row has (any more): left out
                      if any(f["disk_parts_per_100k_mb"].get(k) for _k, f in split_rows)}
            add("| rows | " + " | ".join(labels.values()) + " | total |")
            add("|---|" + "---|" * (len(labels) + 1))
            for _k, f in split_rows:
                d = f["disk_parts_per_100k_mb"]
                add(f"| {scale_label(f['n'])} | "
                    + " | ".join(str(d.get(k, "–")) for k in labels)
                    + f" | {round(sum(d.values()), 1)} |")
            add("")
        add("Start-up is `MemoryEngine(...)` in a fresh process with a lookup embedder (model "
            "load excluded; see the embedding section), by bench/probe.py. *open + first "
            "query*: the engine opened on its index cache and asked one unfiltered semantic "
            "query at once; cached graphs are then still being read in the background, so it "
            "is answered exactly and its notes say so (*exact, noted*). *graphs read after*: "
            "from the start of the open until the background has checksummed and read every "
            "graph and encoded its nodes' codes from the vector files; *first query ms, graphs "
            "read*: the first query after that. *previous "
            "release*: `--before PYTHON` runs the same probe with another checkout's engine "
            "(it copies every cached array into memory and reads every graph before it "
            "answers). Each start-up figure is the median of three fresh processes (other "
            "work shares the machine). *disk*: blocks allocated (`du`): the room after each "
            "cached array and each vector file's rows is a hole and takes none; *disk db*: "
            "memory.db and the vector files (the store), *disk index*: `index/` (a cache). "
            "*RSS per 100k*: resident memory after the first query "
            "and 20 more, minus that after imports, scaled; *anon* is what only this process "
            "holds (graphs, ids, rows added since the start), *file* the pages of the mapped "
            "vector and cache files that searches (and a graph's encoding) touched, counted "
            "in whole page-cache blocks (here a few rows map about 1 MB each, read-ahead "
            "being 8 MB), clean pages the OS drops "
            "under memory pressure and reads back. *graphs read*: a process that waited "
            "for its graphs; *first "
            "queries exact*: one that searched at once, exactly, touching every vector once. "
            "*rebuild* = `index/` deleted, so ids, slots and places are read from memory.db, "
            "the vector files mapped (every row's checksum checked) and HNSW graphs "
            "rebuilt in the background (the figure is the open); *(from build.json)*: not "
            "re-run in this invocation (`--rebuild-max 1M` re-measures it), the "
            "figure recorded in the cached store's build.json. Rows of the *previous release "
            "(earlier run)* are kept from the run before mapped arrays: RSS after open, not "
            "split; start = open + first query.")
        for _k, f in fs:
            if f.get("cached_graphs") == 0 and f["start_cache_load"].get("first_query_notes"):
                note = f["start_rebuild"].get("note")
                add("")
                add(f"{scale_label(f['n'])}: the store's cache holds no HNSW graph, so the "
                    "open + first query figure is that of a start whose graphs are not ready "
                    "(the background builds them meanwhile, at the lowest priority); graphs "
                    "read and RSS with graphs are not measured there."
                    + (f" Rebuild: {note}." if note else ""))
    else:
        add("Not run.")
    add("")

    # ---- peers --------------------------------------------------------------------------------
    add("## " + SECTION_TITLES["peers"])
    add("")
    pr_all = _by_prefix(res, "peers")
    if not pr_all:
        add("Not run.")
        add("")
    for _k, pr in pr_all:
        if "peers" not in pr:
            add(f"Error: {pr.get('error')}")
            continue
        ours = pr["ours"]
        fx = pr.get("ours_fixed") or {}
        passes = ""
        if "p50_first_pass" in ours.get("combined", {}):
            passes = (" (ours measured before and after the peers, pooled; combined p50 "
                      f"{_f(ours['combined']['p50_first_pass'])} / "
                      f"{_f(ours['combined']['p50_last_pass'])} ms, semantic-only "
                      f"{_f(ours['semantic']['p50_first_pass'])} / "
                      f"{_f(ours['semantic']['p50_last_pass'])} ms in the two passes)")
        add(f"{scale_label(pr['n'])} rows, {pr['queries']} queries per kind, k={pr['k']}, same "
            f"vectors and filters{passes}; ours in the same run: combined p50 "
            f"{_f(ours['combined']['latency_ms']['p50'])} ms "
            f"(exact {_pct(ours['combined']['exact_fraction'])}), semantic-only p50 "
            f"{_f(ours['semantic']['latency_ms']['p50'])} ms as the engine is; with the "
            "prototyped fixes combined p50 "
            f"{_f(fx.get('combined', {}).get('latency_ms', {}).get('p50'))} ms (exact "
            f"{_pct(fx.get('combined', {}).get('exact_fraction'))}), semantic-only p50 "
            f"{_f(fx.get('semantic', {}).get('latency_ms', {}).get('p50'))} ms.")
        add("")
        add("| peer | query | how | queries | p50 ms | p99 ms | ratio p50 (peer/ours) | "
            "ratio p50 (peer/ours fixed) | exact | recall@5 | short of k | ingest s | "
            "peak RSS MB |")
        add("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for peer, v in pr["peers"].items():
            if "kinds" not in v:
                add(f"| {peer} | – | error: {v.get('error')} |||||||||||")
                continue
            for kind, kv in v["kinds"].items():
                add(f"| {peer} {v.get('version') or ''} | {kind} | {kv.get('how') or ''} | "
                    f"{kv.get('queries_run', pr['queries'])} | "
                    f"{_f(kv['latency_ms']['p50'], 2)} | {_f(kv['latency_ms']['p99'], 2)} | "
                    f"{kv['ratio_p50']} | {kv.get('ratio_p50_fixed', '–')} | "
                    f"{_pct(kv['exact_fraction'])} | "
                    f"{_f(kv['recall_at_k'])} | {kv['short_of_k']} | {_f(v.get('ingest_s'), 1)}"
                    f" | {_f(v.get('rss_peak_mb'), 0)} |")
            if v.get("cannot_express"):
                add(f"| {peer} | – | cannot express: {v['cannot_express']} |||||||||||")
        add("")

    # ---- ROS / limit / wall --------------------------------------------------------------------
    add("## " + SECTION_TITLES["ros"])
    add("")
    ros = res.get("ros")
    if ros and "combined" in ros:
        add(f"`memory-server` on a copy of the {scale_label(ros['n'])} store (ready after "
            f"{ros.get('server_ready_s')} s), client `memory_node.srv.Search` from the bench "
            "process, discovery on localhost, its own domain id.")
        add("")
        add("| server | query | round trip p50 ms | p99 ms | server took_ms p50 | exact |")
        add("|---|---|---|---|---|---|")
        for label, var in (ros.get("variants") or {"as_is": ros}).items():
            name = {"as_is": "memory-server", "fixed": "with prototyped fixes"}.get(label, label)
            if "error" in var:
                add(f"| {name} | error: {var['error']} |||||")
                continue
            br = var.get("bad_request_round_trip_ms")
            if br:
                add(f"| {name} | bad request (transport + JSON only) | {_f(br['p50'])} | "
                    f"{_f(br['p99'])} | – | – |")
            for kind in ("combined", "semantic"):
                v = var[kind]
                add(f"| {name} | {kind} | {_f(v['round_trip_ms']['p50'])} | "
                    f"{_f(v['round_trip_ms']['p99'])} | {_f(v['server_took_ms']['p50'])} | "
                    f"{_pct(v['exact_fraction'])} |")
    else:
        add("Not measured: " + str((ros or {}).get("skipped") or (ros or {}).get("error")
                                   or "not run"))
    add("")
    _index_section(add, res)
    _semantic_section(add, res)
    if "tf_load" in res:
        _tf_load_section(res["tf_load"], add)
    add("## " + SECTION_TITLES["limit"])
    add("")
    if bw:
        add(f"numpy copy bandwidth {bw} GB/s (read + write); a 100k x 384 float32 mat-vec best "
            f"{lim['matvec_100k_best_ms']} ms vs {lim['matvec_100k_at_bandwidth_ms']} ms at that "
            "bandwidth.")
    else:
        add("Not run.")
    add("")
    add("## Section wall times")
    add("")
    add("| section | wall s | load average after |")
    add("|---|---|---|")
    for k, v in res.items():
        if isinstance(v, dict) and "wall_s" in v:
            add(f"| {k} | {v['wall_s']} | {v.get('loadavg_after')} |")
    add("")
    notes = out / "NOTES.md"
    if notes.exists():
        add(notes.read_text().strip())
        add("")
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("\n".join(L) + "\n" + _kept_blocks(report))


def _sweep_table(add: Any, qs: list[tuple[str, dict[str, Any]]]) -> None:
    """Semantic-only latency and recall against the graph's efSearch and M (the query
    section's sweep; recall against brute force over every row, or over one stream's)."""
    rows = [(r, e) for _k, r in qs for e in r.get("ef_sweep") or [] if "recall_at_5" in e]
    if not rows:
        return
    add("")
    add("### Semantic-only vs the graph's efSearch and M")
    add("")
    add("The typed planner (`run_search`, no JSON) on the cached store, one query at a time; "
        "*one stream*: the same queries restricted to one stream (camera 60%, lidar 15%, odom "
        "15%, events 10% of them: the graph's nearest rows of that stream; events, and a "
        "stream too few of whose rows are near the query, scanned exactly). Recall against "
        "brute force. The engine's setting is marked **in use**; rows of another M (when the "
        "sweep is given some) are graphs built for it over the same rows (build s, 2 shared "
        "cores). Latencies swing with the shared machine's load; compare recalls.")
    add("")
    add("| rows (vectors) | M | efSearch | semantic p50 ms | recall@5 | recall@10 | one stream "
        "p50 ms | one stream recall@5 | one stream recall@10 | build s |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    for r, e in rows:
        ix = r.get("index", {})
        eff = (ix.get("effective_ef_search") or {}).values()
        used = e["m"] == ix.get("hnsw_m") and e["ef_search"] in eff
        add(f"| {scale_label(r['n'])} ({r['vectors']}) | {e['m']} | {e['ef_search']}"
            f"{' **in use**' if used else ''} | {_f(e['typed_ms']['p50'])} | "
            f"{_f(e['recall_at_5'])} | {_f(e['recall_at_10'])} | "
            f"{_f(e['stream_typed_ms']['p50'])} | {_f(e['stream_recall_at_5'])} | "
            f"{_f(e['stream_recall_at_10'])} | {e.get('build_s', '–')} |")
    add("")


SET_NAMES = {"separated": "well-separated clusters", "overlap": "overlapping clusters",
             "minilm": "MiniLM captions", "synthetic": "clusters on a 32-d manifold"}


def _semantic_section(add: Any, res: dict[str, Any]) -> None:
    """Semantic-only search, every system side by side in one run (bench/semantic_bench.py)."""
    secs = _by_prefix(res, "semantic")
    if not secs:
        return
    add("")
    add("## Semantic-only search side by side (issue 27)")
    add("")
    add("Command: `.venv/bin/python -m bench --only semantic --scales 100k` (`--sets` picks "
        "the vector sets; ChromaDB runs in `bench/.venv-peers`, which the benchmark creates). "
        "One query at a time, k=5 (recall@10 from the same queries at k=10); recall against "
        "brute force over every row (a row tied with the k-th exact score counts). "
        "*memory_node*: `MemoryEngine.search(json)`, JSON in and out, query embedding "
        "excluded (a lookup embedder), after its graph was built and calibrated itself on "
        "rows held out of it and on 256 real queries asked before the measured ones (what "
        "it chose to serve, the graph walk's efSearch or its inverted file's lists probed, "
        "the rerank depth, and the recall@5 it measured, in the last column); "
        "measured before and after the others (the second pass's p50 in the notes). "
        "*FAISS HNSW alone*: `IndexHNSWFlat` on float vectors, no ids, rows or JSON. "
        "*numpy exact*: one matrix-vector product and a partial sort. Everything on one "
        "thread except ChromaDB (its own process, its defaults).")
    for label, r in secs:
        if "error" in r:
            add("")
            add(f"{label}: failed ({r['error']})")
            continue
        add("")
        sets = (r.get("params") or {}).get("sets") or list(r.get("sets", {}))
        add(f"**{scale_label(r.get('n', 0))}**, {r.get('queries')} queries per set "
            f"(`python -m bench --only semantic --scales {scale_label(r.get('n', 0))} --sets "
            f"{','.join(sets)}`); section {r.get('wall_s')} s, load average after "
            f"{r.get('loadavg_after')} (2 shared cores: other work may run at the same time, "
            "compare within a set).")
        _semantic_verdicts(add, r)
        add("")
        add("| set | system | p50 ms | p99 ms | recall@5 | recall@10 | notes |")
        add("|---|---|---|---|---|---|---|")
        for vset, rows in r.get("sets", {}).items():
            for name, row in rows.items():
                if "error" in row:
                    add(f"| {SET_NAMES.get(vset, vset)} | {name} | – | – | – | – | "
                        f"failed: {row['error']} |")
                    continue
                lat = row["latency_ms"]
                note = row.get("how") or ""
                if name == "memory_node":
                    c = row.get("calibration") or {}
                    p2 = row.get("p50_second_pass")
                    c0 = row.get("calibration_at_start") or {}
                    real = row.get("real_queries")
                    dims = c.get("graph_dims")
                    note = (_searched_with(c) + f", rerank {c.get('rerank', '–')}"
                            + (f", graph over {dims} components" if dims else "")
                            + f", calibrated recall@5 {c.get('recall_at_5', '–')} on "
                            f"{c.get('calibration_queries', '–')} queries"
                            + (f" ({real} of them real, earlier than the measured ones)"
                               if real else " (held-out rows)")
                            + (f"; before those: {_searched_with(c0)}, rerank "
                               f"{c0.get('rerank', '–')}" if c0 and real else "")
                            + (f"; second pass p50 {p2:.3f} ms" if p2 is not None else ""))
                elif name == "chroma":
                    note = f"ChromaDB {row.get('version')}, {note}, ingest {row.get('ingest_s')} s"
                add(f"| {SET_NAMES.get(vset, vset)} | {name} | {lat['p50']:.3f} | "
                    f"{lat['p99']:.3f} | {row['recall_at_5']:.3f} | {row['recall_at_10']:.3f} "
                    f"| {note} |")
            b = (r.get("building") or {}).get(vset)
            if b and "latency_ms" in b:
                add(f"| {SET_NAMES.get(vset, vset)} | memory_node while its graph is built "
                    f"from nothing | {b['latency_ms']['p50']:.3f} | {b['latency_ms']['p99']:.3f}"
                    f" | {b['recall_at_5']:.3f} | – | {b['queries']} queries, one every 20 ms, "
                    f"over the {b['graph_ready_s']} s the build took (open {b['open_s']} s); "
                    f"{_searched_by(b)}; second "
                    f"half p50 {b['second_half_latency_ms']['p50']:.3f} ms, recall@5 "
                    f"{b['second_half_recall_at_5']:.3f} |")
        _profile_table(add, r)
    add("")


def _semantic_verdicts(add: Any, r: dict[str, Any]) -> None:
    """Issue 27's bars: p50 <= 1.0 ms at 100k (4 ms at 1M) and below ChromaDB's in the same
    run, recall@5 >= 0.99; <= 3 ms at 100k while the graph is built."""
    n = r.get("n", 0)
    bar = 1.0 if n <= 100_000 else 4.0
    add("")
    for vset, rows in r.get("sets", {}).items():
        ours, chroma = rows.get("memory_node") or {}, rows.get("chroma") or {}
        if "latency_ms" not in ours:
            continue
        p50, rec = ours["latency_ms"]["p50"], ours["recall_at_5"]
        vs = "ChromaDB not run"
        if "latency_ms" in chroma:
            c50 = chroma["latency_ms"]["p50"]
            vs = (f"ChromaDB {c50:.3f} ms (recall@5 {chroma['recall_at_5']:.3f}): "
                  f"{'below' if p50 < c50 else 'NOT below'}")
        ok = p50 <= bar and rec >= 0.99
        add(f"- {SET_NAMES.get(vset, vset)}: memory_node p50 {p50:.3f} ms (bar {bar} ms), "
            f"recall@5 {rec:.3f} (bar 0.99): {'met' if ok else 'NOT met'}; {vs}.")
        b = (r.get("building") or {}).get(vset)
        if b and "latency_ms" in b:
            bp = b["latency_ms"]["p50"]
            add(f"- {SET_NAMES.get(vset, vset)}, while the graph is built: p50 {bp:.3f} ms "
                f"(bar 3 ms): {'met' if bp <= 3.0 else 'NOT met'}, recall@5 "
                f"{b['recall_at_5']:.3f}.")


def _searched_with(c: dict) -> str:
    """What served unfiltered searches, in a note's words: the graph walk's efSearch, or the
    inverted file's lists probed (`streams`' "indexes" entry)."""
    if c.get("searched_by") == "inverted file":
        return f"inverted file, {c.get('nprobe', '–')} lists probed"
    return f"efSearch {c.get('ef_search', '–')}"


def _searched_by(b: dict[str, Any]) -> str:
    """How the queries during a first build found their rows, in words."""
    by = b.get("searched_by")
    if not by:  # a result from before the coarse index
        return f"{b['with_partial_graph']} of them walked a copy of the part built"
    words = {"coarse alone": "probed the coarse index of every row",
             "copy + coarse": "walked a copy of the part built and probed the coarse index "
                              "for the rest",
             "copy + scan": "walked a copy of the part built and scanned the rest",
             "exact": "scanned every row"}
    out = ", ".join(f"{n} {words.get(k, k)}" for k, n in by.items())
    rec = b.get("coarse_recall_at_5_held_out")
    return out + ("" if rec is None else f" (the coarse index measured recall@5 {rec:.3f} on "
                  "the rows held out of the graph)")


def _profile_table(add: Any, r: dict[str, Any]) -> None:
    """Where one semantic-only query's time goes, per set (bench/semantic_bench.py)."""
    profs = {v: rows["memory_node"].get("profile") for v, rows in r.get("sets", {}).items()
             if isinstance(rows.get("memory_node"), dict)}
    profs = {v: p for v, p in profs.items() if p}
    if not profs:
        return
    add("")
    add("Where one semantic-only query's time goes, request text to answer text "
        "(`MemoryEngine.search`, k=5): each stage run on its own, median µs over "
        f"{next(iter(profs.values()))['reps']} runs; *fixed* is every stage but the graph "
        "search (what a query pays whatever the index); *whole call* the same query "
        "through `search` (it adds the error guard and the timing).")
    add("")
    add("| stage | " + " | ".join(SET_NAMES.get(v, v) for v in profs) + " |")
    add("|---|" + "---|" * len(profs))
    stages = list(next(iter(profs.values()))["stages_us"])
    for st in stages:
        add(f"| {st} | " + " | ".join(f"{p['stages_us'].get(st, 0):.1f}" for p in
                                       profs.values()) + " |")
    add("| **fixed (all but the graph search)** | " + " | ".join(
        f"**{p['fixed_us']:.1f}**" for p in profs.values()) + " |")
    add("| whole call | " + " | ".join(f"{p['whole_call_us']:.1f}" for p in profs.values())
        + " |")


def _index_section(add: Any, res: dict[str, Any]) -> None:
    add("## " + SECTION_TITLES["index"])
    add("")
    items = _by_prefix(res, "index")
    if not items:
        add("Not run (`python -m bench --only index --scales 100k`).")
        add("")
        return
    add("Command: `.venv/bin/python -m bench --only index --scales 100k,1M --vectors synthetic "
        "--queries 200` (bench/index_bench.py). Every ratio compares two figures measured in "
        "the same process on the same data.")
    add("")
    for key, v in items:
        if "error" in v:
            add(f"- {key}: failed: {v['error']}")
            continue
        lab = f"{scale_label(v['n'])} ({v['vectors']})"
        r, c, t, k = v["rebuild"], v["cold"], v["time_order"], v["cache"]
        add(f"**{lab}**, {v['nq']} queries per kind, one at a time.")
        add("")
        add("| measurement | now | baseline (same run) | ratio |")
        add("|---|---|---|---|")
        for kind in ("semantic", "combined"):
            add(f"| {kind} p50 while every graph is rebuilt in the background ("
                f"{r['rebuild_s']} s, {len(r['graphs'])} graphs, 2 shared cores; a query "
                f"every 20 ms) | "
                f"{_f(r['during'][kind]['p50'])} ms | {_f(r['idle'][kind]['p50'])} ms, "
                f"graphs idle | {r['ratio_p50'][kind]}x |")
            add(f"| {kind} p99 while rebuilding | {_f(r['during'][kind]['p99'])} ms | "
                f"{_f(r['idle'][kind]['p99'])} ms, graphs idle | {r['ratio_p99'][kind]}x |")
        inline = ("the inline build the previous release ran inside it"
                  if c.get("inline_from", "inline") == "inline" else
                  "the build the previous release ran inside it (taken from the background "
                  "rebuild above, same rows)")
        add(f"| first unfiltered query after a start with no cached graph | "
            f"{_f(c['first_query_ms'], 2)} ms (exact; notes say so: {c['first_query_noted']}) "
            f"| {c['inline_build_s']} s: {inline} "
            f"| {c['first_query_ratio']}x sooner |")
        q = c["queries_while_building"]
        ready = (f"graphs ready after {c['graphs_ready_s']} s" if c["graphs_ready_s"] is not None
                 else f"watched for the first {c.get('watched_s')} s of the build (a whole "
                 "build is timed above)")
        add(f"| semantic queries while graphs build from nothing | p50 {_f(q['p50'])} ms, "
            f"p99 {_f(q['p99'])} ms, exact {_pct(c['exact_while_building'])} | {ready} "
            f"(open {c['open_s']} s) | – |")
        add(f"| combined path, camera rows ({t['rows']}), 5% inserted late | p50 "
            f"{_f(t['late_now']['p50'])} ms | in time order p50 {_f(t['in_order']['p50'])} ms "
            f"| {t['ratio_late_vs_in_order']}x |")
        add(f"| combined path with late rows: previous release (whole-stream mask) | p50 "
            f"{_f(t['late_before']['p50'])} ms | now p50 {_f(t['late_now']['p50'])} ms | "
            f"{t['ratio_before_vs_now']}x slower before |")
        if k.get("checksummed") == "arrays":  # graphs are checked and read in the background
            add(f"| start-up with the cache ({k['cache_mb']} MB): open, checksums of the "
                f"arrays and sampled verification included (graphs are checked and read in "
                f"the background) | {k['open_s']} s | array checksums alone "
                f"{k['checksum_s']} s | {_pct(k['checksum_share'])} of the open |")
        else:
            add(f"| start-up with the cache ({k['cache_mb']} MB): open, checksums and sampled "
                f"verification included | {k['open_s']} s | checksums alone "
                f"{k['checksum_s']} s | {_pct(k['checksum_share'])} of the open |")
        add(f"| writing the cache (new generation + manifest rename, fsynced) | "
            f"{k['persist_s']} s | sampled verification {k['verify_sample_ms']} ms | – |")
def _ratio(a: Any, b: Any) -> str:
    try:
        return f"{float(a) / float(b):.2f}x"
    except (TypeError, ValueError, ZeroDivisionError):
        return "–"


def _tf_load_section(tl: dict[str, Any], add: Any) -> None:
    """bench/tf_load.py: memory-node under 100 Hz /tf with joints, this code and (optionally)
    the code before the fix, then the sample bag replayed at several rates."""
    add("## " + SECTION_TITLES["tf_load"])
    add("")
    if "error" in tl:
        add(f"Error: {tl['error']}")
        add("")
        return
    p = tl.get("params", {})
    m = tl.get("machine", {})
    add(f"Command: `{tl.get('command', 'python -m bench --only tf_load')}`. "
        f"Machine: {m.get('cpus', '?')} CPUs shared with other agents' work (load average "
        f"{m.get('loadavg', '?')} at the start, {tl.get('loadavg_after', '?')} after); one "
        "run per configuration, one after the other, so compare them as ratios.")
    add("")
    add(f"Load ({p.get('duration_s', '?')} s per configuration), published from the bench "
        "process into `memory-node --memory-dir D`: /tf at 100 Hz, each message 20 joint "
        "transforms below base_link + odom -> base_link, map -> odom at 20 Hz (2,120 "
        "transforms/s); camera rgb8 at 14 Hz "
        f"({p.get('camera', '640x480')}), lidar 20k points at 8 Hz, odometry at 20 Hz, all "
        "stamped with the wall clock. The robot stands still 5 s at each of four known poses "
        "and moves 1 s between them; a note is saved through /memory/save 1 s and 3 s into "
        "every stop and its pose compared with the stop's (a pose more than ~1 s old lands "
        "metres off). *before* is commit 96d4174 (two TF subscriptions per process, "
        "deserialized by rclpy), *fixed* this branch (one listener reading CDR bytes).")
    add("")
    cfgs = tl.get("configs", {})
    add("| code | notes (stale) | notes > 0.05 m off | pose error max / p50 m | "
        "pose age p50 / max s | "
        "TF msgs/s published / processed | CPU % memory-node | CPU % publisher | "
        "received / published (cam, lidar, odom) | recorder dropped (cam, lidar, odom) | "
        "SIGINT stop s, exit |")
    add("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, c in cfgs.items():
        if "error" in c:
            add(f"| {label} | error: {c['error']} ||||||||||")
            continue
        off = [n for n in c.get("note_rows", []) if n.get("err_m", 0.0) > 0.05]
        off_s = str(len(off)) + (" (" + ", ".join(f"{n['err_m']} m at {n['after_s']:g} s into "
                                                  f"stop {n['stop']}" for n in off[:3]) + ")"
                                 if off else "")
        rec = c.get("recorder", {})
        streams = ("camera", "lidar", "odom")
        recv = ", ".join(f"{rec.get(s, {}).get('received', '?')}/"
                         f"{rec.get(s, {}).get('published', '?')}" for s in streams)
        drop = ", ".join(str(rec.get(s, {}).get("dropped", "?")) for s in streams)
        e, a, cpu = c.get("pose_err_m", {}), c.get("pose_age_s", {}), c.get("cpu_percent", {})
        age = (f"{a.get('p50')} / {a.get('max')}" if a.get("p50") is not None
               else "not reported")
        add(f"| {label} | {c.get('notes')} ({c.get('notes_stale')}) | {off_s} | "
            f"{e.get('max')} / "
            f"{e.get('p50')} | {age} | {c.get('tf_messages_published_per_s')} / "
            f"{c.get('tf_messages_processed_per_s') or 'not counted'} | "
            f"{cpu.get('memory-node')} | {cpu.get('publisher (this process)')} | {recv} | "
            f"{drop} | {c.get('stop', {}).get('seconds')}, {c.get('stop', {}).get('exit_code')} |")
    add("")
    if "fixed" in cfgs and "before" in cfgs and "error" not in cfgs["before"] \
            and "error" not in cfgs["fixed"]:
        f, b = cfgs["fixed"], cfgs["before"]
        add(f"Ratios before / fixed: memory-node CPU "
            f"{_ratio(b['cpu_percent']['memory-node'], f['cpu_percent']['memory-node'])}, "
            f"save round trip p50 {_ratio(b['save_rtt_s']['p50'], f['save_rtt_s']['p50'])} "
            f"({b['save_rtt_s']['p50']} s / {f['save_rtt_s']['p50']} s), max "
            f"{_ratio(b['save_rtt_s']['max'], f['save_rtt_s']['max'])}.")
        add("")
    tf = (cfgs.get("fixed") or {}).get("recorder", {}).get("tf")
    if tf:
        add(f"Listener counters (fixed, whole run): {tf.get('tf_messages')} /tf messages read, "
            f"{tf.get('tf_edges')} transforms stored, {tf.get('tf_filtered')} joint transforms "
            f"dropped before decoding, {tf.get('tf_malformed')} malformed.")
        add("")
    ing = tl.get("ingest", {})
    if ing:
        add("Sample bag (memory_node.sim, seed 7: camera 320x240 at 12 Hz, lidar 8 Hz, "
            "odometry 20 Hz, TF 20 Hz) replayed with `memory-replay --rate R` into "
            "`memory-node --use-sim-time`; counters from its final `recorder stopped:` line; "
            "stop = seconds from one SIGINT right after the replay's drain to exit.")
        add("")
        add("| code | rate | received / in bag (cam, lidar, odom) | kept (cam, lidar, odom) | "
            "dropped (cam, lidar, odom) | CPU % | SIGINT stop s, exit |")
        add("|---|---|---|---|---|---|---|")
        for label, r in ing.items():
            if "error" in r or "skipped" in r:
                add(f"| {label} | {r.get('error') or r.get('skipped')} ||||||")
                continue
            for rate, v in r.get("rates", {}).items():
                if "error" in v:
                    add(f"| {label} | {rate}x | error: {v['error']} |||||")
                    continue
                recv = ", ".join(f"{v['received'][s]}/{v['in_bag'][s]}"
                                 for s in ("camera", "lidar", "odom"))
                kept = ", ".join(str(v["kept"][s]) for s in ("camera", "lidar", "odom"))
                drop = ", ".join(str(v["dropped"][s]) for s in ("camera", "lidar", "odom"))
                add(f"| {label} | {float(rate):g}x | {recv} | {kept} | {drop} | "
                    f"{v['cpu_percent']} | {v.get('stop_s', '–')}, {v.get('exit_code', '–')} |")
        add("")
    for line in tl.get("notes", []):
        add(f"- {line}")
    if tl.get("notes"):
        add("")


def _kept_blocks(report: Path) -> str:
    """Sections other benchmarks write into the report between `<!-- NAME:begin -->` and
    `<!-- NAME:end -->` (bench/fleet_bench.py, bench/soak.py): carried over as they are."""
    import re

    if not report.exists():
        return ""
    found = re.finditer(r"<!-- (\w+):begin -->.*?<!-- \1:end -->", report.read_text(), re.S)
    return "".join("\n" + m.group(0) + "\n" for m in found)
