"""The typed registry: lazy "module:attr" values, clear errors, and plugins found through real
`importlib.metadata` entry points (a dist-info folder on sys.path, as pip installs it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trace_lib.errors import UserInputError
from trace_lib.registry import ENTRY_POINT_GROUPS, Registry, import_object

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plugin_dist import install_dist  # noqa: E402

PLUGIN = '''
import sys

IMPORTED = True


class EchoLabeler:
    name = "echo"
    model = None
    concurrency = 1

    def __init__(self, **cfg):
        self.cfg = cfg


class Provider:
    def __init__(self, **cfg):
        self.cfg = cfg


class Importer:
    name = "plugin_fmt"
    description = "a plugin's format"
    streaming = False

    def matches(self, doc):
        return False


IMPORTER = Importer()


class InlineBackend:
    name = "inline"


def make_env():
    from trace_lib.train.smoke_envs import TargetLetterEnv
    return TargetLetterEnv()
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """`trace-plugin-demo` installed into a folder on sys.path; removed after the test."""
    root = tmp_path / "site"
    install_dist(root, "trace-plugin-demo", {
        ENTRY_POINT_GROUPS["labelers"]: {"echo": "trace_plugin_demo:EchoLabeler",
                                         "heuristic": "trace_plugin_demo:EchoLabeler"},
        ENTRY_POINT_GROUPS["llm_providers"]: {"plugin_llm": "trace_plugin_demo:Provider"},
        ENTRY_POINT_GROUPS["importers"]: {"plugin_fmt": "trace_plugin_demo:IMPORTER"},
        ENTRY_POINT_GROUPS["job_backends"]: {"inline": "trace_plugin_demo:InlineBackend",
                                             "broken": "trace_plugin_demo:Missing"},
        ENTRY_POINT_GROUPS["environments"]: {"plugin/letters": "trace_plugin_demo:make_env"},
    }, {"trace_plugin_demo": PLUGIN})
    monkeypatch.syspath_prepend(str(root))
    yield root
    monkeypatch.undo()
    sys.modules.pop("trace_plugin_demo", None)


def _fresh(registry: Registry) -> Registry:
    registry.reload_entry_points()
    return registry


# ----------------------------------------------------------------------- the helper itself
def test_lazy_values_are_imported_on_first_get_only():
    reg: Registry[object] = Registry("widget", builtins={"dumps": "json:dumps"})
    sys.modules.pop("json.tool", None)
    reg.register("tool", "json.tool:main")
    assert reg.names() == ["dumps", "tool"] and "tool" in reg and len(reg) == 2
    assert "json.tool" not in sys.modules  # listing imports nothing
    assert callable(reg.get("tool")) and "json.tool" in sys.modules
    import json

    assert reg["dumps"] is json.dumps and reg.target("dumps") == "json:dumps"
    assert reg.source("dumps") == "builtin" and reg.source("tool") == "registered"


def test_unknown_names_and_taken_names_are_clear_errors():
    reg: Registry[int] = Registry("gizmo", builtins={"a": 1, "b": 2})
    with pytest.raises(UserInputError, match=r"unknown gizmo 'z'; expected one of: a, b$"):
        reg.get("z")
    with pytest.raises(UserInputError, match="gizmo 'a' is already registered"):
        reg.register("a", 3)
    reg.register("a", 3, replace=True)
    assert reg.get("a") == 3
    reg.unregister("a")
    assert reg.get("a") == 1  # the built-in is back

    class MyError(Exception):
        pass

    other: Registry[int] = Registry("thing", error=MyError)
    with pytest.raises(MyError, match=r"unknown thing 'x'; expected one of: \(none\)"):
        other.get("x")


def test_bad_lazy_targets_name_what_is_wrong():
    reg: Registry[object] = Registry("widget", builtins={
        "nomod": "no_such_module_xyz:thing", "noattr": "json:nothing_here", "bad": "json"})
    with pytest.raises(UserInputError, match="widget 'nomod': cannot import module "
                                             "'no_such_module_xyz'"):
        reg.get("nomod")
    with pytest.raises(UserInputError, match="module 'json' has no 'nothing_here'"):
        reg.get("noattr")
    with pytest.raises(UserInputError, match="not of the form 'package.module:attribute'"):
        reg.get("bad")
    assert import_object("os.path:join.__name__") == "join"  # dotted attributes


def test_entry_points_are_discovered_loaded_lazily_and_never_shadow_builtins(plugin):
    reg: Registry[object] = Registry("labeler", group=ENTRY_POINT_GROUPS["labelers"],
                                     builtins={"heuristic": "json:dumps"})
    assert reg.names() == ["heuristic", "echo"]
    assert "trace_plugin_demo" not in sys.modules  # found from metadata, not imported
    assert reg.source("echo") == "entry point trace-plugin-demo"
    assert reg.target("echo") == "trace_plugin_demo:EchoLabeler"
    assert reg.get("echo").__name__ == "EchoLabeler"
    assert reg.conflicts() == ["heuristic = trace_plugin_demo:EchoLabeler"]
    import json

    assert reg.get("heuristic") is json.dumps


def test_a_broken_entry_point_fails_only_when_used(plugin):
    reg: Registry[object] = Registry("job backend", group=ENTRY_POINT_GROUPS["job_backends"])
    assert set(reg.names()) == {"inline", "broken"}
    assert reg.get("inline").__name__ == "InlineBackend"
    with pytest.raises(UserInputError, match=r"job backend 'broken' \(entry point "
                                             r"'trace_plugin_demo:Missing' in group "
                                             r"'trace_workbench.job_backends'\)"):
        reg.get("broken")


# -------------------------------------------------------------- the project's registries
def test_every_extension_point_takes_plugins(plugin):
    from trace_lib.diagnose.labelers import LABELERS, get_labeler
    from trace_lib.envs import registry as envs
    from trace_lib.ingest import formats
    from trace_lib.jobs.backends import BACKENDS
    from trace_lib.llm import PROVIDERS, get_provider

    try:
        assert "echo" in _fresh(LABELERS).names()
        assert get_labeler("echo", model="m").cfg == {"model": "m"}
        assert "plugin_llm" in _fresh(PROVIDERS).names()
        assert get_provider("plugin_llm", base_url="u").cfg == {"base_url": "u"}
        assert "plugin_fmt" in _fresh(formats.IMPORTERS).names()
        assert formats.get_importer("plugin_fmt").description == "a plugin's format"
        assert "plugin_fmt" in formats.format_names()
        assert {"local", "ray", "inline"} <= set(_fresh(BACKENDS).names())
        spec = envs.resolve_static("plugin/letters") if "plugin/letters" in _fresh(
            envs.ENVIRONMENTS) else None
        assert spec is not None and spec.source == "python"
        assert spec.factory == "trace_plugin_demo:make_env"
        env = envs.build_env(envs.EnvSpec.from_json(spec.to_json()))
        env.reset(1)
        assert env.capability == "toy_target_letter"
    finally:
        sys.path.remove(str(plugin))
        for reg in (LABELERS, PROVIDERS, formats.IMPORTERS, BACKENDS, envs.ENVIRONMENTS):
            reg.reload_entry_points()
    assert "echo" not in LABELERS.names()


def test_unknown_names_in_the_project_registries():
    from trace_lib.diagnose.labelers import get_labeler
    from trace_lib.jobs import get_backend
    from trace_lib.llm import LLMError, get_provider

    with pytest.raises(UserInputError, match="unknown labeler 'nope'; expected one of: "
                                             "anthropic, heuristic, openai"):
        get_labeler("nope")
    with pytest.raises(LLMError, match="unknown LLM provider 'nope'"):
        get_provider("nope")
    with pytest.raises(UserInputError, match="unknown job backend 'nope'; expected one of: "
                                             "local, ray"):
        get_backend("nope")


MORE = '''
from dataclasses import replace

from trace_lib.envs.capabilities import CapabilitySpec, task_builder
from trace_lib.envs.capabilities.precondition_verification import retail_cancel
from trace_lib.envs.domains.retail import DOMAIN as RETAIL

TEMPLATE = "{{ messages[0].content }}"  # a string: taken as it is, never imported
DOMAIN = replace(RETAIL, name="shop")


@task_builder("shop_refunds", "shop", tools=retail_cancel.tools,
              policy_sections=retail_cancel.policy_sections)
def shop_cancel(db, rng, difficulty):
    return retail_cancel(db, rng, difficulty)


CAPABILITY = CapabilitySpec.of("shop_refunds", shop_cancel, description="refunds in a shop")


class Source:
    name = "plugin-model"
    description = "a plugin's model"

    def build(self, dest):
        raise NotImplementedError


SOURCE = Source()


def server_for(request):
    return ("served", request.model, request.served_model_name)


class Encoder:
    name = "plugin-encoder"

    def encode(self, texts):
        return [[1.0] for _ in texts]


class Generator:
    name = "plugin_gen"
    model = None

    def __init__(self, config):
        self.config = config
'''


def test_the_tables_that_were_hand_rolled_take_plugins_too(tmp_path, monkeypatch):
    from trace_lib.envs import generate
    from trace_lib.envs.capabilities import CAPABILITIES, builtin_pairs, make_capability_env
    from trace_lib.envs.domains import DOMAINS, domain_names, get_domain
    from trace_lib.explore.embeddings import ENCODERS, get_encoder
    from trace_lib.runtime import base_models
    from trace_lib.runtime.chat_format import CHAT_TEMPLATES, chat_template_for
    from trace_lib.runtime.server_kinds import SERVER_KINDS, make_policy_server

    root = tmp_path / "site"
    install_dist(root, "trace-plugin-more", {
        ENTRY_POINT_GROUPS["chat_templates"]: {"plugin_family": "trace_plugin_more:TEMPLATE"},
        ENTRY_POINT_GROUPS["policy_servers"]: {"plugin_server": "trace_plugin_more:server_for"},
        ENTRY_POINT_GROUPS["model_sources"]: {"plugin-model": "trace_plugin_more:SOURCE"},
        ENTRY_POINT_GROUPS["encoders"]: {"plugin-encoder": "trace_plugin_more:Encoder"},
        ENTRY_POINT_GROUPS["env_generators"]: {"plugin_gen": "trace_plugin_more:Generator"},
        ENTRY_POINT_GROUPS["domains"]: {"shop": "trace_plugin_more:DOMAIN"},
        ENTRY_POINT_GROUPS["capabilities"]: {"shop_refunds": "trace_plugin_more:CAPABILITY"},
    }, {"trace_plugin_more": MORE})
    monkeypatch.syspath_prepend(str(root))
    registries = (CHAT_TEMPLATES, SERVER_KINDS, base_models.MODEL_SOURCES, ENCODERS,
                  generate.GENERATORS, DOMAINS, CAPABILITIES)
    try:
        for reg in registries:
            _fresh(reg)
        assert chat_template_for("plugin_family") == "{{ messages[0].content }}"
        assert make_policy_server("plugin_server", "m", served_model_name="s") == (
            "served", "m", "s")
        assert "plugin-model" in [m["name"] for m in base_models.list_models()]
        assert get_encoder("plugin-encoder").encode(["a", "b"]) == [[1.0], [1.0]]
        assert generate.GENERATORS["plugin_gen"](generate.GenerationConfig()).name == "plugin_gen"
        assert "shop" in domain_names() and get_domain("shop").name == "shop"
        assert list(CAPABILITIES)[-1] == "shop_refunds"  # after the built-ins
        assert ("shop", "shop_refunds") in builtin_pairs()
        env = make_capability_env("shop", "shop_refunds")
        assert env.description == "refunds in a shop"
    finally:
        monkeypatch.undo()
        sys.modules.pop("trace_plugin_more", None)
        for reg in registries:
            reg.reload_entry_points()
    assert "shop" not in domain_names() and "plugin_server" not in SERVER_KINDS


def test_unknown_names_in_the_tables_that_were_hand_rolled():
    """The messages users saw before these tables became registries, word for word."""
    from trace_lib.envs.capabilities import make_capability_env
    from trace_lib.envs.domains import get_domain
    from trace_lib.explore.embeddings import get_encoder
    from trace_lib.ingest.formats import get_importer
    from trace_lib.runtime.chat_format import chat_template_for
    from trace_lib.runtime.server_kinds import make_policy_server

    with pytest.raises(UserInputError, match=r"^unknown format 'x'; expected one of: auto, "
                                             r"swe_agent, inspect, openai_jsonl, tau2, "
                                             r"tau_bench, otel, otel_session$"):
        get_importer("x")
    with pytest.raises(KeyError, match=r"unknown domain 'x'; known: airline, retail"):
        get_domain("x")
    with pytest.raises(KeyError, match=r"unknown capability 'x'; known: "
                                       r"structured_data_reasoning, multi_step_task_completion"):
        make_capability_env("airline", "x")
    with pytest.raises(ValueError, match=r"^unknown embedding model 'x'; known: "
                                         r"\['all-MiniLM-L6-v2'\]$"):
        get_encoder("x")
    with pytest.raises(UserInputError, match=r"^no chat template for model family 'x'; "
                                             r"known: chatml, qwen2, smollm2, tiny$"):
        chat_template_for("x")
    with pytest.raises(UserInputError, match=r"^server: expected one of ours, vllm, got 'x'$"):
        make_policy_server("x", "tiny")


def test_listing_names_imports_none_of_the_modules_named():
    """Built-ins are lazy "module:attr" strings: no module registers itself by being
    imported, and the one that owns a table does not import what it lists."""
    import subprocess

    listed = {
        "trace_lib.ingest.formats": ("IMPORTERS", "trace_lib.ingest.inspect_logs"),
        "trace_lib.envs.domains": ("DOMAINS", "trace_lib.envs.domains.airline"),
        "trace_lib.envs.capabilities": ("CAPABILITIES",
                                        "trace_lib.envs.capabilities.tool_calling_precision"),
        "trace_lib.runtime.server_kinds": ("SERVER_KINDS", "trace_lib.runtime.vllm_server"),
    }
    code = ["import importlib, sys"]
    for module, (table, _) in listed.items():
        code.append(f"print(len(importlib.import_module({module!r}).{table}.names()))")
    code.append(f"print(sorted(m for m in {[m for _, m in listed.values()]!r} "
                "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    *counts, imported = out.stdout.splitlines()
    assert [int(c) for c in counts] == [7, 2, 4, 2] and imported == "[]"


def test_every_built_in_of_these_tables_resolves():
    """A typo in a lazy "module:attr" string fails here, not at a user's first use."""
    from trace_lib.envs.capabilities import CAPABILITIES
    from trace_lib.envs.domains import DOMAINS
    from trace_lib.ingest.formats import IMPORTERS
    from trace_lib.runtime.chat_format import CHAT_TEMPLATE, CHAT_TEMPLATES
    from trace_lib.runtime.server_kinds import SERVER_KINDS

    assert [IMPORTERS[n].name for n in IMPORTERS] == IMPORTERS.names()
    assert [DOMAINS[n].name for n in DOMAINS] == DOMAINS.names()
    assert [CAPABILITIES[n].name for n in CAPABILITIES] == CAPABILITIES.names()
    assert all(CHAT_TEMPLATES[n] is CHAT_TEMPLATE for n in CHAT_TEMPLATES)
    assert all(callable(SERVER_KINDS[n]) for n in SERVER_KINDS)


def test_the_cli_choices_that_are_spelled_out_are_the_built_ins():
    """`--help` stays fast, so a verb spells its choices out; they must be the table's
    (the formats' are checked in tests/ingest/test_commands.py)."""
    import argparse

    from trace_lib.cli import build_parser
    from trace_lib.envs.generate import GENERATORS
    from trace_lib.runtime.server_kinds import SERVER_KINDS

    def choices(parser: argparse.ArgumentParser, *verbs: str, dest: str) -> list[str]:
        for verb in verbs:
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            parser = sub.choices[verb]
        return list(next(a.choices for a in parser._actions if a.dest == dest))

    parser = build_parser()
    assert choices(parser, "env", "generate", dest="generator") == GENERATORS.names()
    assert choices(parser, "train", dest="server") == SERVER_KINDS.names()
