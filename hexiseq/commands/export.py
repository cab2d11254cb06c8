"""`hexiseq export RUN_DIR --to DIR`: a run's checkpoint as a Hugging Face model directory.

The newest checkpoint of the run (or --checkpoint NAME) is verified against its manifest, its
weights gathered into one process and written as config.json + model.safetensors, atomically:
`transformers.LlamaForCausalLM.from_pretrained(DIR)` loads it.
"""

from __future__ import annotations

import argparse

from ..runs.export import export


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="a run's checkpoint in Hugging Face layout (transformers loads it)", description=__doc__
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory")
    p.add_argument("--to", required=True, metavar="DIR", help="output directory (new, empty, or an earlier export)")
    p.add_argument("--checkpoint", metavar="NAME", help="which checkpoint (default: the newest, e.g. step-00000020)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="cast the weights (default: as trained)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(
        f"exported {args.run_dir} to {export(args.run_dir, args.to, args.checkpoint, args.dtype)} (Hugging Face layout)"
    )
    return 0
