"""Execute notebooks in place on a GPU and stamp them with provenance.

    python -m kernels.authoring.record                 # every notebook under book/ and solutions/
    python -m kernels.authoring.record book/01_formats.ipynb

Each notebook is run top to bottom with nbclient in its own folder.  Its metadata gets
``provenance`` = {gpu, capability, torch, triton, date, code_sha256}, and a markdown cell tagged
``provenance`` at the top tells the reader where the outputs come from.  ``code_sha256`` hashes the
code cells only, so ``tests/test_provenance.py`` can tell when code changed after the recording.
"""

import argparse
import hashlib
import pathlib
import sys

import nbformat

PROVENANCE_TAG = "provenance"
DEFAULT_PATHS = ("book", "solutions")
KEYS = ("gpu", "capability", "torch", "triton", "date", "code_sha256")


def code_sha256(nb) -> str:
    """Hash of the notebook's code cells (sources only, in order)."""
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(cell.source.encode("utf-8"))
            h.update(b"\x00")
    return h.hexdigest()


def provenance_text(prov: dict) -> str:
    return (
        f"> **Outputs recorded** on {prov['gpu']} (sm_{prov['capability'].replace('.', '')}) · "
        f"torch {prov['torch']} · triton {prov['triton']} · {prov['date']} · "
        f"code sha256 `{prov['code_sha256'][:12]}`"
    )


def is_provenance_cell(cell) -> bool:
    return PROVENANCE_TAG in cell.get("metadata", {}).get("tags", [])


def stamp(nb, prov: dict) -> None:
    """Replace any provenance cell and metadata with ``prov``."""
    nb.cells = [c for c in nb.cells if not is_provenance_cell(c)]
    cell = nbformat.v4.new_markdown_cell(provenance_text(prov))
    cell.metadata["tags"] = [PROVENANCE_TAG]
    cell.id = "provenance"
    nb.cells.insert(0, cell)
    nb.metadata[PROVENANCE_TAG] = prov


def environment() -> dict:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(
            "kernels.authoring.record: no CUDA GPU here. Book and solution outputs must come from a GPU run; "
            "run this on a machine with an NVIDIA GPU."
        )
    from kernels.device import gpu_environment

    env = gpu_environment()
    return {"gpu": env.pop("device"), **env}


def notebooks(paths) -> list:
    found = []
    for p in map(pathlib.Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts)
        elif p.suffix == ".ipynb" and p.exists():
            found.append(p)
        else:
            raise SystemExit(f"kernels.authoring.record: {p} is neither a notebook nor a folder")
    return found


def record(path: pathlib.Path, env: dict, timeout: int = 1200) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if not is_provenance_cell(c)]
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent.resolve())}}
    )
    client.execute()
    stamp(nb, {**env, "code_sha256": code_sha256(nb)})
    nbformat.write(nb, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.authoring.record", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=list(DEFAULT_PATHS), help="notebooks or folders")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds allowed per cell")
    args = parser.parse_args(argv)
    env = environment()
    failed = []
    for path in notebooks(args.paths):
        print(f"recording {path} on {env['gpu']} ...", flush=True)
        try:
            record(path, env, args.timeout)
        except Exception as exc:  # noqa: BLE001 - report every notebook, then fail
            failed.append(path)
            print(f"  FAILED: {type(exc).__name__}: {str(exc)[-2000:]}", flush=True)
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(map(str, failed))}", file=sys.stderr)
        return 1
    return 0


__all__ = [
    "DEFAULT_PATHS",
    "KEYS",
    "PROVENANCE_TAG",
    "code_sha256",
    "environment",
    "is_provenance_cell",
    "main",
    "notebooks",
    "provenance_text",
    "record",
    "stamp",
]


if __name__ == "__main__":
    sys.exit(main())
