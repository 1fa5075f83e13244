"""CLI verbs for models and serving: `model prepare|list` and `serve`.

Design decisions
- Kept apart from `train` and `job` because models and the policy server are shared by
  the train and compose stages; the handlers call `trace_lib.workbench.models`.
- `model prepare NAME` builds a registered model into the models folder once (progress on
  stderr) and prints where it is; `serve` runs the CPU policy server in the foreground on
  127.0.0.1, the same server a training job starts in-process. Its limits (`--max-n`,
  `--max-body-bytes`, `--kv-cache-mb`) are the server config's fields, defaults included
  (read from `ServerConfig`, never repeated here); a bad value is a usage error (exit 2).
"""

from __future__ import annotations

import argparse

from trace_lib.cli.output import print_json

# (flag, ServerConfig field, smallest value, help); defaults come from ServerConfig.
SERVER_LIMITS = (
    ("--max-n", "max_n", 1, "most choices (n) one request may ask for"),
    ("--max-body-bytes", "max_body_bytes", 1024, "largest request body; larger is a 413"),
    ("--kv-cache-mb", "kv_cache_mb", 0, "prefix/turn KV cache size in MB (0: off)"),
)


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") \
                from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def _prepare(args: argparse.Namespace) -> int:
    from trace_lib.workbench import models

    path = models.prepare_model(args.name, rebuild=args.rebuild)
    if args.json:
        print_json({"name": args.name, "path": str(path)})
    else:
        print(path)
    return 0


def _list(args: argparse.Namespace) -> int:
    from trace_lib.workbench import models

    rows = models.list_models()
    if args.json:
        print_json(rows)
    else:
        for row in rows:
            state = "ready" if row["ready"] else "not built"
            print(f"{row['name']:<14} {state:<10} {row['description']}  ({row['path']})")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from trace_lib.workbench import models

    models.serve_policy(args.model, port=args.port,
                          served_model_name=args.served_model_name,
                          max_tokens=args.max_tokens, threads=args.threads,
                          **{field: getattr(args, field) for _, field, _, _ in SERVER_LIMITS})
    return 0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `model` and `serve` to the CLI."""
    model = sub.add_parser("model", help="base models: build/cache and list them")
    msub = model.add_subparsers(dest="model_verb", metavar="ACTION")
    msub.required = True
    prep = msub.add_parser("prepare", parents=[common],
                           help="build a registered model (tiny, smollm2-135m) into data/models")
    prep.add_argument("name", help="registered model name, e.g. tiny or smollm2-135m")
    prep.add_argument("--rebuild", action="store_true", help="rebuild even if cached")
    prep.add_argument("--json", action="store_true", help="print one JSON object")
    prep.set_defaults(func=_prepare)
    lst = msub.add_parser("list", parents=[common], help="registered models and their cache")
    lst.add_argument("--json", action="store_true", help="print one JSON list")
    lst.set_defaults(func=_list)

    srv = sub.add_parser("serve", parents=[common],
                         help="run the CPU policy server (OpenAI + vLLM LoRA API) on 127.0.0.1")
    srv.add_argument("--model", default="tiny", help="tiny | smollm2-135m | HF folder")
    srv.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: free port)")
    srv.add_argument("--served-model-name", default=None,
                     help="name clients pass as model= (default: --model)")
    srv.add_argument("--max-tokens", type=int, default=256,
                     help="max_tokens when a request gives none")
    srv.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    from trace_lib.workbench.models import server_defaults  # no torch: cheap for --help

    defaults = server_defaults()
    for flag, field, low, text in SERVER_LIMITS:
        srv.add_argument(flag, dest=field, type=_int_at_least(low), default=None,
                         help=f"{text} (default: {getattr(defaults, field)})")
    srv.set_defaults(func=_serve)
