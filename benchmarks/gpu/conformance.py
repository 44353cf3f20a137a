"""The shared StableHLO conformance cases (../shared/conformance) on a GPU: compiled here for a
CUDA target, run where the GPU is with only the runtime side of the package (docs/gpu.md).

    python benchmarks/gpu/conformance.py prepare DIR [--target cuda:sm_90] [--jobs 2]   # here
    DISC_RAL_DIR=<ral build> python benchmarks/gpu/conformance.py run DIR [--jobs 4]    # on the GPU machine

`prepare` reads the harness's prepared cases (its cache, `$CONFORMANCE_CACHE`, filled by any run of
`../shared/conformance/conformance.py`): each case's program (a static case's inputs made
arguments, a dynamic case as it is: compiled once, called at two sizes), its inputs and the
expected outputs that XLA computed. It writes per case the artifact compiled for the target, the
arrays and the harness's description, and a copy of the harness (its comparison is the one
the CPU runs use). `run` calls each artifact on every input set (numpy in, numpy out: copied to
the device and back), compares with the harness's tolerances, and prints one line per case that
does not match and a summary; cases run in child processes, so a case that takes its process
down is reported as such, and so is a case whose GPU error ends the process's context (CUDA's
errors of a kernel are sticky), and the rest still run. Exits 1 if any case failed."""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "conformance.py"


def _compile_one(job: tuple[str, str, str]) -> tuple[str, str]:
    """Compiles one prepared case into OUT/cases/<slug>/: -> (slug, '' or why not)."""
    import disc_stablehlo as disc

    source, out, target = job
    src, slug = Path(source), Path(source).name
    meta = json.loads((src / "meta.json").read_text())
    try:
        f = disc.compile((src / meta["program"]).read_text(), target=target)
    except disc.DiscError as e:
        return slug, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    dest = Path(out) / "cases" / slug
    dest.mkdir(parents=True, exist_ok=True)
    f.save(dest / "program.disc")
    shutil.copy(src / "arrays.npz", dest / "arrays.npz")
    (dest / "meta.json").write_text(json.dumps({k: meta[k] for k in ("path", "mode", "arrays", "inputs", "expected", "cases")
                                                if k in meta}))
    return slug, ""


def prepare(out: Path, target: str, jobs: int) -> int:
    cache = Path(os.environ.get("CONFORMANCE_CACHE", "/tmp/conformance-cache")) / "prep"
    sys.path.insert(0, str(HARNESS.parent))
    import conformance as harness

    versions = {"static": harness.PREP_VERSION, "dynamic": harness.DYN_PREP_VERSION}
    cases = []
    for d in sorted(cache.glob("*")):
        meta = json.loads((d / "meta.json").read_text()) if (d / "meta.json").is_file() else {}
        if meta.get("status") == "ok" and meta.get("prep_version") == versions.get(meta.get("mode")):
            cases.append(str(d))
    if not cases:
        print(f"no prepared cases in {cache}: run ../shared/conformance/conformance.py (e.g. --runner disc --select all) first")
        return 1
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(HARNESS, out / "harness.py")
    start, failed = time.perf_counter(), []
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        for slug, why in pool.map(_compile_one, [(c, str(out), target) for c in cases], chunksize=8):
            if why:
                failed.append(slug)
                print(f"{slug}: not compiled: {why}", flush=True)
    (out / "index.json").write_text(json.dumps({"target": target, "cases": sorted(Path(c).name for c in cases),
                                                "not_compiled": failed}))
    print(f"{len(cases) - len(failed)} of {len(cases)} cases compiled for {target} in {time.perf_counter() - start:.0f} s")
    return 0


def run_cases(folder: Path, slugs: list[str], results: Path) -> None:
    """One child: runs `slugs` in order, appending a line to `results` before each case starts and
    one with its outcome after (the parent reads the last started case of a child that died)."""
    sys.path.insert(0, str(folder))
    import harness  # the harness's array loading and comparison, carried with the cases

    import disc_stablehlo as disc

    with results.open("a") as log:
        for slug in slugs:
            log.write(json.dumps({"start": slug}) + "\n")
            log.flush()
            d = folder / "cases" / slug
            meta = json.loads((d / "meta.json").read_text())
            sets = ([{"label": "static", "inputs": meta["inputs"], "expected": meta["expected"]}] if meta["mode"] == "static"
                    else [{"label": f"size{c['size']}", "inputs": c["inputs"], "expected": c["expected"]} for c in meta["cases"]])
            try:
                arrays = harness.load_arrays(str(d / "arrays.npz"), meta["arrays"])
                f = disc.load(d / "program.disc")
                outcome = "pass"
                for s in sets:
                    got = harness.as_output_list(f(*[arrays[n] for n in s["inputs"]]))
                    ok, infos = harness.compare_outputs(got, [arrays[n] for n in s["expected"]])
                    if not ok:
                        bad = next(i for i in infos if "reason" in i)
                        outcome = f"mismatch [{s['label']}] output {bad['output']}: {bad['reason']}"
                        break
            except Exception as e:  # noqa: BLE001  (every case is run and reported)
                outcome = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            log.write(json.dumps({"case": slug, "outcome": outcome}) + "\n")
            log.flush()
            if "CUDA_ERROR" in outcome:  # the context is lost to every later call of this process
                sys.exit(3)


def run(folder: Path, jobs: int) -> int:
    import torch

    index = json.loads((folder / "index.json").read_text())
    todo = [s for s in index["cases"] if s not in index["not_compiled"]]
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"device: {gpu}, torch {torch.__version__}; {len(todo)} cases compiled for {index['target']}",
          flush=True)
    start = time.perf_counter()
    outcomes: dict[str, str] = {}
    for old in folder.glob("results.*.jsonl"):  # an earlier run's (the children append)
        old.unlink()
    parts = itertools.count(1)  # one results file per child (next() is atomic: the threads share it)

    def child(slugs: list[str]) -> None:
        while slugs:  # a child that stops early (a case took the process or its GPU context down): a new one goes on
            results = folder / f"results.{next(parts)}.jsonl"
            proc = subprocess.run([sys.executable, __file__, "run-cases", str(folder), str(results), *slugs],
                                  capture_output=True, text=True)
            started, finished = None, None
            for line in results.read_text().splitlines() if results.exists() else []:
                r = json.loads(line)
                started = r.get("start", started)
                if "case" in r:
                    outcomes[r["case"]], finished = r["outcome"], r["case"]
            if started is None:
                outcomes.update({s: f"not run: the process ended (exit {proc.returncode})" for s in slugs})
                return
            if started != finished:
                outcomes[started] = f"process died (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:] or ''}"
            slugs = slugs[slugs.index(started) + 1:]

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        list(pool.map(child, [todo[i::jobs] for i in range(jobs)]))
    failed = sorted(s for s, o in outcomes.items() if o != "pass")
    for slug in failed:
        print(f"FAIL {slug}: {outcomes[slug]}", flush=True)
    missing = [s for s in todo if s not in outcomes]
    for slug in index["not_compiled"]:
        print(f"NOT COMPILED {slug}", flush=True)
    print(f"{len(todo) - len(failed) - len(missing)} of {len(index['cases'])} conformance cases match on the GPU "
          f"({len(index['not_compiled'])} not compiled, {len(failed)} failed, {len(missing)} not run) "
          f"in {time.perf_counter() - start:.0f} s")
    return 1 if failed or missing or index["not_compiled"] else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["prepare", "run", "run-cases"])
    ap.add_argument("folder")
    ap.add_argument("rest", nargs="*")
    ap.add_argument("--target", default="cuda:sm_90")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    if a.command == "prepare":
        os.environ.setdefault("DISC_COMPILE_HELPER", "0")
        sys.exit(prepare(Path(a.folder), a.target, a.jobs))
    if a.command == "run":
        sys.exit(run(Path(a.folder), a.jobs))
    run_cases(Path(a.folder), a.rest[1:], Path(a.rest[0]))
