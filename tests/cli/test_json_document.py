"""`--json` is one JSON document on stdout for every verb: whatever else a verb or the
stages under it print (the trainer's `[train] ...` lines) goes to stderr."""

from __future__ import annotations

import argparse
import json

from trace_lib import cli


def _json_verbs(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(verb path, its parser) for every verb that takes `--json`, sub-verbs included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _json_verbs(sub, (*path, name))
    if path and any("--json" in a.option_strings for a in parser._actions):
        yield path, parser


def test_every_json_verb_prints_one_document_whatever_else_it_prints(capsys):
    verbs = list(_json_verbs(cli.build_parser()))
    assert len(verbs) >= 15, [v for v, _ in verbs]
    for path, parser in verbs:
        # the verb's real parser and `main`; its function prints noise on stdout first, as
        # the stages under a verb do, then its document
        def noisy(args: argparse.Namespace, _path=path) -> int:
            print(f"[{_path[0]}] progress line")
            cli.print_json({"verb": list(_path)})
            return 0

        capsys.readouterr()
        code = _main_with(parser, path, noisy)
        out = capsys.readouterr()
        assert code == 0
        assert json.loads(out.out) == {"verb": list(path)}, path
        assert f"[{path[0]}] progress line" in out.err


def _main_with(parser: argparse.ArgumentParser, path: tuple[str, ...], func) -> int:
    """`cli.main` on a parser whose verb function is `func`: the verb's own parser with its
    required arguments filled by placeholders."""
    argv = [*path, "--json"]
    for a in parser._actions:
        if a.required or not a.option_strings:
            if isinstance(a, argparse._SubParsersAction) or a.dest == "help":
                continue
            value = (a.choices and list(a.choices)[0]) or "x"
            argv += ([a.option_strings[0]] if a.option_strings else []) + (
                [str(value)] * (a.nargs if isinstance(a.nargs, int) else 1))
    original = cli.build_parser

    def build() -> argparse.ArgumentParser:
        p = original()
        _sub_parser(p, path).set_defaults(func=func)
        return p

    cli.build_parser = build
    try:
        return cli.main(argv)
    finally:
        cli.build_parser = original


def _sub_parser(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    for name in path:
        parser = next(a for a in parser._actions
                      if isinstance(a, argparse._SubParsersAction)).choices[name]
    return parser


def test_train_json_is_one_document_although_the_trainer_prints(tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))
    code = cli.main(["train", "--db", str(tmp_path / "t.duckdb"), "--env",
                     "trace_lib.train.smoke_envs:TargetLetterEnv", "--model", "tiny",
                     "--steps", "1", "--group", "2", "--groups-per-step", "1",
                     "--max-tokens", "4", "--max-turns", "1", "--eval-seeds", "0",
                     "--run-dir", str(tmp_path / "run"), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    doc = json.loads(out.out)  # the whole of stdout is the document
    assert doc["steps"] == 1 and doc["adapter_path"]
    assert "[train] step 1/1" in out.err
