"""Environment use cases: list, inspect, play, validate, calibrate, generate, review.

Design decisions
- ONE name -> environment resolution: `resolve` (a built-in name, a stored generated one,
  or a .py path) and `open_environment` (sandboxed unless built-in). Training and gate
  training reach an environment through `job_environment`, which resolves the name here,
  checks the approval rule and puts a generated environment's code into the job's config
  (jobs never read the store).
- "Only approved environments can be trained" lives in `require_trainable`, which both the
  CLI `train` / `gates` and the pages go through; the error names the environment and its
  status. Your own code (`module:Class`, a registered plugin, a .py file) is not a catalog
  environment and has no status to check. A built-in nobody has reviewed may be trained only when the caller
  asks for a smoke run explicitly (the Training page's checkbox); a rejected one never.
- The validation report (including a sandbox failure as a rejection) and the "keep the
  approval when an approved environment validates again" rule are built once, in
  `validate`; the page and `env validate` record the same report.
- A generation request always carries the capability's description and excerpts of the
  failed trajectories the capability lists as examples, whichever front end asks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.envs.curriculum import DIFFICULTIES  # noqa: F401 - the pages' choices
from trace_lib.envs.sandbox import SandboxError  # pages catch it too
from trace_lib.errors import UserInputError
from trace_lib.store import capabilities as store_capabilities

Db = str | Path | None
Progress = Callable[[int, int], None]

STATUS_ICONS = {"approved": "✅", "validated": "🟢", "rejected": "⛔", "draft": "📝",
                "your code": "🧩"}
OWN_CODE_STATUS = "your code"  # a plugin environment's listing status: nothing to review
N_EXAMPLES = 3


# --------------------------------------------------------------------- names and lists


def resolve(name: str, db: Db = None):
    """The EnvSpec of a built-in name, a stored generated name, a .py file, a registered
    plugin or package.module:Attr (`envs.catalog.resolve`: the app side's resolution)."""
    from trace_lib.envs.catalog import resolve as _resolve

    return _resolve(name, db=db)


def env_specs(names: Any, db: Db = None) -> dict[str, dict[str, Any]]:
    """{name: serialised EnvSpec} (generated code included) for stage code that builds
    environments but never reads the store: composition's evaluation, routing and export
    (`compose.local_client.env_factory`), and the gate job."""
    return {name: resolve(name, db=db).to_json() for name in names}


def open_environment(spec_or_name: Any, db: Db = None, options: dict[str, Any] | None = None):
    """A context manager yielding the environment; sandboxed unless built-in. `options`:
    how a built-in is built (tools=capability|all, policy=excerpt|full, difficulty=1|2|3)."""
    from trace_lib.envs import open_environment as _open

    return _open(spec_or_name, db=db, options=options)


def start_environment(spec: Any, options: dict[str, Any] | None = None):
    """A live environment the caller keeps across interactions and closes (the page's
    Play tab); sandboxed unless built-in. `options` as in `open_environment`."""
    from trace_lib.envs.registry import build_env

    return build_env(spec, options=options if spec.source == "builtin" else None)


def list_environments(db: Db = None) -> list[dict[str, Any]]:
    """Every environment with capability, domain, version, source, status, calibration."""
    from trace_lib.envs.catalog import list_environments as _list

    return _list(db=db)


def environment_names() -> list[str]:
    """The environment names pickers offer without a database: the built-ins, then your
    own registered ones (plugins of the `trace_workbench.environments` entry-point group)."""
    from trace_lib.envs.registry import builtin_names

    return builtin_names() + [r["name"] for r in plugin_environments()]


def plugin_environments() -> list[dict[str, Any]]:
    """Your own environments, registered in this process or by an installed distribution
    under the `trace_workbench.environments` entry-point group, as listing rows. Names
    only: nothing of the plugin is imported until one is used. They are your code, not
    catalog environments, so they have no review status (`OWN_CODE_STATUS`)."""
    from trace_lib.envs.registry import ENVIRONMENTS

    return [{"name": name, "capability": "", "domain": "", "version": 1, "source": "python",
             "code_sha256": None, "path": None, "status": OWN_CODE_STATUS,
             "validated_figures": None, "calibration_mean_reward": None,
             "calibration_in_band": None}
            for name in ENVIRONMENTS.names()]


def status_of(name: str, db: Db = None) -> str:
    """The review status of a catalog environment ("draft" until something is recorded)."""
    from trace_lib.envs import catalog

    row = catalog.get_row(name, db=db) if store.resolve_db_path(db).exists() else None
    return row["status"] if row else "draft"


def detail(name: str, db: Db = None) -> dict[str, Any]:
    """What the page shows about one environment: spec, status, report, code, attempts."""
    from trace_lib.envs import catalog
    from trace_lib.envs.registry import source_code

    spec = resolve(name, db=db)
    row = catalog.get_row(name, db=db) or {"status": "draft", "report": {}}
    attempts = catalog.list_attempts(env_name=name, db=db) if spec.source == "generated" else []
    return {"spec": spec, "status": row["status"], "report": row["report"],
            "code": source_code(spec), "attempts": attempts}


def capability_names() -> list[str]:
    """The capabilities an environment can be generated for: those of the one catalog
    (`trace_lib.capabilities`) that have built-in task builders to start from."""
    from trace_lib.envs.capabilities import CAPABILITIES

    return sorted(CAPABILITIES)


def domain_names() -> list[str]:
    from trace_lib.envs.domains import domain_names as _names

    return _names()


def schema_diff(tools: list[dict[str, Any]], domain: str) -> dict[str, Any]:
    from trace_lib.envs.validate import schema_diff as _diff

    return _diff(tools, domain)


def calibration_figures(calibration: dict[str, Any]) -> list[Any]:
    from trace_lib.envs import calibration_charts

    return calibration_charts.calibration_figures(calibration)


# ---------------------------------------------------------------------- inspect / play


def sample(name: str, seed: int = 0, db: Db = None, options: dict[str, Any] | None = None,
           model: str | None = None) -> dict[str, Any]:
    """One instance: prompt, tools, messages, hint, ground truth (`env sample`); with
    `model`, the prompt's token count in that model's tokenizer and chat template."""
    with open_environment(name, db=db, options=options) as env:
        env.reset(seed)
        out = {
            "name": env.name, "capability": env.capability, "domain": env.domain,
            "version": env.version, "seed": seed, "system_prompt": env.system_prompt,
            "tool_schemas": env.tool_schemas, "messages": env.messages, "hint": env.hint,
            "ground_truth": getattr(env, "ground_truth", None),
            "build_options": options or {},
        }
    if model:
        from trace_lib.runtime.base_models import load_tokenizer
        from trace_lib.runtime.chat_format import render_prompt

        tok = load_tokenizer(model)
        text = render_prompt(out["messages"], out["tool_schemas"] or None)
        out["prompt_tokens"] = {"model": model,
                                "total": len(tok(text, add_special_tokens=False)["input_ids"])}
    return out


def play(name: str, seed: int = 0, actions: list[dict[str, Any]] | None = None,
         reference: bool = False, db: Db = None) -> dict[str, Any]:
    """Play an instance with the given actions or the reference policy (`env play`)."""
    transcript: list[dict[str, Any]] = []
    with open_environment(name, db=db) as env:
        env.reset(seed)
        transcript.append({"role": "user", "content": env.messages[-1]["content"]})
        actions = list(actions or [])
        i = 0
        while not env.done and (reference or i < len(actions)):
            action = env.reference_action() if reference else actions[i]
            i += 1
            transcript.append({"action": action, "observation": env.step(action)})
        summary = env.summary()
    return {"name": name, "seed": seed, "transcript": transcript, "summary": summary}


# -------------------------------------------------------------------------- validation


def sandbox_failure_report(name: str, exc: Any) -> dict[str, Any]:
    """The report of a module that could not even be loaded in the sandbox: a rejection."""
    return {"name": name, "status": "rejected",
            "checks": {"sandbox": {"passed": False, **exc.to_dict()}},
            "figures": {"sandbox": exc.kind},
            "errors": [f"loading the module failed [{exc.kind}]: {exc.message[:1500]}"]}


def status_after_validation(current: str | None, validation_status: str) -> str:
    """The row's new status: an approved environment that validates again stays approved;
    otherwise the validation's verdict (validated | rejected) is the status."""
    if current == "approved" and validation_status == "validated":
        return "approved"
    return validation_status


def validate(name: str, n_seeds: int = 50, db: Db = None,
             progress: Progress | None = None,
             options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate an environment and record the report (`env validate`, the Validate button).

    A .py path is only checked, never recorded (nothing unreviewed enters the store)."""
    from trace_lib.envs import catalog
    from trace_lib.envs.validate import ValidationConfig, validate_environment

    spec = resolve(name, db=db)
    try:
        with open_environment(spec, db=db, options=options) as env:
            report = validate_environment(env, ValidationConfig(n_seeds=n_seeds),
                                          progress=progress)
            report["build_options"] = options or {}
            report["sandbox_layers"] = getattr(env, "layers", None)
    except SandboxError as exc:
        report = sandbox_failure_report(spec.name, exc)
    if spec.source != "file":
        row = catalog.get_row(spec.name, db=db)
        catalog.record_report(spec, "validation", report,
                              status=status_after_validation(row and row["status"],
                                                             report["status"]), db=db)
    return report


def calibrate(name: str, policy: str = "epsilon:0.5", seeds: int = 100, group: int = 16,
              seed_offset: int = 10_000, db: Db = None, progress: Progress | None = None,
              env: Any = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Reward distribution of a policy against the band; recorded unless a .py path.

    `env` lets a caller calibrate the live environment it already holds (the page)."""
    from trace_lib.envs import catalog
    from trace_lib.envs.calibrate import CalibrationConfig
    from trace_lib.envs.calibrate import calibrate as _calibrate

    spec = resolve(name, db=db)
    cfg = CalibrationConfig(seeds=seeds, group=group, seed_offset=seed_offset)
    if env is not None:
        result = _calibrate(env, policy, cfg, progress=progress)
    else:
        with open_environment(spec, db=db, options=options) as opened:
            result = _calibrate(opened, policy, cfg, progress=progress)
    if spec.source != "file":
        catalog.record_report(spec, "calibration",
                              {k: v for k, v in result.items() if k != "group_means"}, db=db)
    return result


# -------------------------------------------------------------------------- generation


def failure_examples(capability: str, db: Db = None) -> tuple[str, list[str]]:
    """The capability's stored description and excerpts of its example failed trajectories
    (what the generator is shown); empty without a database or capability row."""
    from trace_lib.trajectories import excerpt, load_trajectories

    if not store.resolve_db_path(db).exists():
        return "", []
    with store.connect(db, read_only=True) as con:
        row = store_capabilities.description_and_examples(con, capability)
        if not row:
            return "", []
        ids = [str(i) for i in row[1]][:N_EXAMPLES]
        texts = []
        for tid in ids:
            try:
                texts.append(excerpt(load_trajectories(con, [tid])[0].trajectory))
            except UserInputError:
                texts.append(tid)  # an example whose trajectory is gone: keep its id
    return row[0] or "", texts


def generation_request(capability: str, domain: str, description: str = "", db: Db = None):
    """The GenerationRequest every front end sends: description and failure examples."""
    from trace_lib.envs.generate import GenerationRequest

    stored, examples = failure_examples(capability, db)
    return GenerationRequest(capability=capability, domain=domain,
                             description=description or stored, examples=examples)


def generate(capability: str, domain: str = "airline", *, generator: str = "template",
             provider: str = "anthropic", model: str | None = None,
             base_url: str | None = None, attempts: int = 3, difficulty: int = 2,
             seeds: int = 50, description: str = "", db: Db = None,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write, sandbox-validate and store an environment for a capability (`env generate`)."""
    from trace_lib.envs.generate import GenerationConfig, generate_environment
    from trace_lib.envs.validate import ValidationConfig

    request = generation_request(capability, domain, description, db)
    cfg = GenerationConfig(generator=generator, provider=provider, model=model or None,
                           base_url=base_url or None, max_attempts=int(attempts),
                           difficulty=int(difficulty),
                           validation=ValidationConfig(n_seeds=int(seeds)))
    return generate_environment(request, cfg, db=db, progress=progress)


# ------------------------------------------------------------------------------ review


def review(name: str, decision: str, note: str = "", force: bool = False,
           db: Db = None) -> dict[str, Any]:
    """Approve or reject (`env approve|reject`, the Review tab); returns name and status."""
    from trace_lib.envs import catalog

    spec = resolve(name, db=db)
    row = catalog.set_status(spec, decision, note=note, force=force, db=db)
    return {"name": spec.name, "status": row.get("status")}


def approve(name: str, note: str = "", force: bool = False, db: Db = None) -> dict[str, Any]:
    return review(name, "approved", note=note, force=force, db=db)


def reject(name: str, note: str = "", db: Db = None) -> dict[str, Any]:
    return review(name, "rejected", note=note, db=db)


# ---------------------------------------------------------------- the training gate


OWN_CODE_SOURCES = ("python", "file")  # module:Class, a registered plugin, a .py file


def require_trainable(name: str, db: Db = None, allow_unreviewed_builtin: bool = False):
    """The EnvSpec of `name` if it may be trained on, else a UserInputError naming the
    environment and its status. The user's own code (`module:Class`, a registered plugin,
    a .py file) is not a catalog environment: it has no review status to check."""
    if not name:
        raise UserInputError("training needs an environment name (--env)")
    spec = resolve(name, db=db)
    if spec.source in OWN_CODE_SOURCES:
        return spec
    status = status_of(spec.name, db=db)
    if status == "approved":
        return spec
    if allow_unreviewed_builtin and spec.source == "builtin" and status != "rejected":
        return spec
    raise UserInputError(
        f"environment {spec.name!r} is {status}: only approved environments can be trained "
        f"(validate and approve it first: `python -m trace_lib env validate {spec.name}`, "
        f"then `python -m trace_lib env approve {spec.name}`)")


def trainable_environments(db: Db = None, include_builtins: bool = False
                           ) -> list[dict[str, Any]]:
    """The environments training offers: approved ones, your registered plugin ones (your
    code: no review, as `require_trainable` says) and, for a smoke run, the built-ins
    nobody reviewed yet when `include_builtins`."""
    catalog_rows = [r for r in list_environments(db)
                    if r["status"] == "approved"
                    or (include_builtins and r["source"] == "builtin"
                        and r["status"] != "rejected")]
    taken = {r["name"] for r in catalog_rows}
    return catalog_rows + [r for r in plugin_environments() if r["name"] not in taken]


def job_environment(config: dict[str, Any], db: Db = None, key: str = "env",
                    allow_unreviewed_builtin: bool = False) -> dict[str, Any]:
    """Check the approval rule for `config[key]` and return the config a job can run without
    the store: the environment's serialised spec goes along as `env_spec` (a generated
    one's code included; `trace_lib.envs.registry.EnvSpec.to_json`)."""
    name = str(config.get(key) or "")
    spec = require_trainable(name, db=db, allow_unreviewed_builtin=allow_unreviewed_builtin)
    if config.get("env_spec"):
        return config
    return {**config, "env_spec": spec.to_json()}


def allow_unsafe_local_sandbox() -> None:
    """Run generated code without the bubblewrap sandbox in this process
    (`--unsafe-local-sandbox`: explicit only, for machines without user namespaces)."""
    from trace_lib.envs.sandbox import allow_unsafe_local

    allow_unsafe_local()
