"""Validation: the checks an environment must pass before anyone may approve it.

    report = validate_environment(env)        # {"checks": {...}, "figures": {...}, "status"}

Design decisions
- Checks and thresholds follow the issue: determinism (same seed -> same instance and the
  same verdict), schema fidelity (every tool is one of the domain's original schemas with
  the same argument names and types), the reference policy solves >= 95% of 50 seeds,
  trivial policies (do nothing; random valid calls) score <= 10% mean reward, loophole
  probes (always refuse, echo the request, keyword stuffing, random read then refuse)
  score <= 5% (a verifier that pays for words instead of work fails here), instances
  differ across seeds, rewards stay in [0, 1]. Each check reports its figure and its
  threshold, so a rejection says by how much.
- An instance's fingerprint is the sha256 of its system prompt, opening messages, tool
  schemas and ground truth; determinism and diversity both compare fingerprints.
- Argument types are compared as a normalised signature (type, enum, $ref target, nested
  item and property types), not as raw JSON: descriptions and titles may differ, names and
  types may not.
- A sandbox failure (violation, timeout, memory, crash) ends validation at once with
  status "rejected" and the failure in the report: a module that tried to escape is not
  measured further.
- The same function validates built-ins (in-process) and generated modules (through
  `SandboxedEnvironment`), so their reports are comparable line by line.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trace_lib.envs.policies import TRIVIAL_POLICIES, make_policy, run_episode
from trace_lib.envs.protocol import Environment


@dataclass
class ValidationConfig:
    n_seeds: int = 50
    determinism_seeds: int = 5
    reference_min_pass: float = 0.95
    trivial_max_reward: float = 0.10
    loophole_max_reward: float = 0.05  # always refuse, echo, keyword stuffing, read+refuse
    distinct_min: float = 0.9  # share of distinct instances among n_seeds
    seed_offset: int = 0


REQUIRED_MEMBERS = ("name", "capability", "domain", "version", "reset", "step", "summary",
                    "system_prompt", "tool_schemas", "messages", "done")


def fingerprint(env: Environment) -> str:
    payload = {
        "system_prompt": env.system_prompt,
        "messages": env.messages,
        "tool_schemas": env.tool_schemas,
        "ground_truth": getattr(env, "ground_truth", None),
    }
    blob = json.dumps(payload, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _signature(schema: Any, defs: dict[str, Any], depth: int = 0) -> Any:
    if not isinstance(schema, dict) or depth > 6:
        return None
    if "$ref" in schema:
        name = schema["$ref"].split("/")[-1]
        return {"ref": name, "of": _signature(defs.get(name, {}), defs, depth + 1)}
    sig: dict[str, Any] = {}
    if "type" in schema:
        sig["type"] = schema["type"]
    if "enum" in schema:
        sig["enum"] = sorted(map(str, schema["enum"]))
    if "anyOf" in schema:
        sig["anyOf"] = sorted(json.dumps(_signature(s, defs, depth + 1), sort_keys=True)
                               for s in schema["anyOf"])
    if "items" in schema:
        sig["items"] = _signature(schema["items"], defs, depth + 1)
    if "properties" in schema:
        sig["properties"] = {k: _signature(v, defs, depth + 1)
                             for k, v in sorted(schema["properties"].items())}
        sig["required"] = sorted(schema.get("required", []))
    return sig


def compare_tool_schemas(tools: list[dict[str, Any]], original: list[dict[str, Any]]
                         ) -> list[dict[str, Any]]:
    """Per tool of the environment: {tool, ok, problems} against the original schemas."""
    by_name = {t["function"]["name"]: t["function"] for t in original}
    results = []
    for tool in tools:
        fn = tool.get("function", {}) if isinstance(tool, dict) else {}
        name = fn.get("name", "?")
        problems: list[str] = []
        if tool.get("type") != "function":
            problems.append("not an OpenAI function tool (type must be 'function')")
        orig = by_name.get(name)
        if orig is None:
            problems.append(f"{name!r} is not a tool of the original domain")
        else:
            mine = fn.get("parameters", {}) or {}
            theirs = orig.get("parameters", {}) or {}
            a, b = mine.get("properties", {}), theirs.get("properties", {})
            if set(a) != set(b):
                extra, missing = sorted(set(a) - set(b)), sorted(set(b) - set(a))
                problems.append(f"argument names differ (extra {extra}, missing {missing})")
            for arg in sorted(set(a) & set(b)):
                if _signature(a[arg], mine.get("$defs", {})) != _signature(
                        b[arg], theirs.get("$defs", {})):
                    problems.append(f"argument {arg!r} has a different type")
            if sorted(mine.get("required", [])) != sorted(theirs.get("required", [])):
                problems.append("required arguments differ")
        results.append({"tool": name, "ok": not problems, "problems": problems})
    return results


TAU2_SCHEMAS = Path(__file__).resolve().parents[3] / "shared" / "data" / "tau2-bench" / \
    "tool_schemas_by_domain.json"


def tau2_comparison(tools: list[dict[str, Any]], domain: str) -> dict[str, Any] | None:
    """Informational: the tools against tau2-bench's published schemas, when that file is
    beside the repository. Not a gate: a domain may add tools tau2 lacks (e.g. `think`)."""
    if not TAU2_SCHEMAS.exists():
        return None
    published = json.loads(TAU2_SCHEMAS.read_text(encoding="utf-8")).get("domains", {})
    if domain not in published:
        return None
    names = {t["function"]["name"] for t in published[domain]}
    shared = [t for t in tools if t.get("function", {}).get("name") in names]
    per_tool = compare_tool_schemas(shared, published[domain])
    return {"matching": sum(t["ok"] for t in per_tool), "compared": len(per_tool),
            "not_in_tau2": sorted({t["function"]["name"] for t in tools} - names),
            "problems": [f"{t['tool']}: {p}" for t in per_tool for p in t["problems"]]}


def _original_schemas(env: Environment) -> list[dict[str, Any]] | None:
    from trace_lib.envs.domains import get_domain

    try:
        return get_domain(env.domain).tool_schemas()
    except KeyError:
        return None


def validate_environment(
    env: Environment,
    config: ValidationConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run every check; returns {"name", "checks", "figures", "status", ...}."""
    from trace_lib.envs.sandbox import SandboxError

    cfg = config or ValidationConfig()
    started = time.monotonic()
    checks: dict[str, dict[str, Any]] = {}
    seeds = list(range(cfg.seed_offset, cfg.seed_offset + cfg.n_seeds))
    total = cfg.determinism_seeds * 2 + cfg.n_seeds * (3 + len(TRIVIAL_POLICIES))
    done = 0

    def tick(n: int = 1) -> None:
        nonlocal done
        done += n
        if progress:
            progress(min(done, total), total)

    report: dict[str, Any] = {"name": getattr(env, "name", "?"),
                              "capability": getattr(env, "capability", "?"),
                              "domain": getattr(env, "domain", "?"),
                              "version": getattr(env, "version", None),
                              "config": asdict(cfg)}
    try:
        missing = [m for m in REQUIRED_MEMBERS if not hasattr(type(env), m)
                   and not hasattr(env, m)]
        checks["protocol"] = {"passed": not missing, "figure": len(missing),
                              "threshold": "0 missing members", "missing": missing}
        if missing:
            raise _Stop()

        # determinism
        same, mismatches = 0, []
        det_seeds = seeds[: cfg.determinism_seeds]  # fewer when fewer seeds were asked for
        for s in det_seeds:
            # The opening (prompt, messages, ground truth) does not change during an
            # episode, so fingerprinting after the run costs no extra reset.
            first = run_episode(env, s, make_policy("reference"))
            fp1 = fingerprint(env)
            tick()
            second = run_episode(env, s, make_policy("reference"))
            fp2 = fingerprint(env)
            tick()
            if fp1 == fp2 and (first["reward"], first.get("passed")) == (
                    second["reward"], second.get("passed")):
                same += 1
            else:
                mismatches.append(s)
        n_det = max(1, len(det_seeds))
        checks["determinism"] = {"passed": same == len(det_seeds),
                                 "figure": same / n_det, "threshold": "1.0",
                                 "seeds": len(det_seeds), "mismatched_seeds": mismatches}

        # schema fidelity
        original = _original_schemas(env)
        tools = env.tool_schemas
        if original is None:
            checks["schema_fidelity"] = {"passed": False, "figure": 0.0, "threshold": "1.0",
                                         "problems": [f"unknown domain {env.domain!r}"]}
        else:
            per_tool = compare_tool_schemas(tools, original)
            ok = sum(t["ok"] for t in per_tool)
            checks["schema_fidelity"] = {
                "passed": bool(per_tool) and ok == len(per_tool),
                "figure": ok / max(1, len(per_tool)), "threshold": "1.0",
                "n_tools": len(per_tool), "n_original": len(original),
                "problems": [f"{t['tool']}: {p}" for t in per_tool for p in t["problems"]],
                "tau2": tau2_comparison(tools, env.domain),
            }

        # reference, trivial policies, diversity, reward range
        results: dict[str, list[dict[str, Any]]] = {}
        fingerprints = []
        for policy_name in ("reference", "null", "random", *TRIVIAL_POLICIES):
            runs = []
            policy = make_policy(policy_name, seed=cfg.seed_offset)
            for s in seeds:
                summary = run_episode(env, s, policy)
                runs.append(summary)
                if policy_name == "reference":
                    fingerprints.append(fingerprint(env))
                tick()
            results[policy_name] = runs
        ref = results["reference"]
        pass_rate = sum(bool(r.get("passed")) for r in ref) / len(ref)
        failed = [{"seed": s, "reasons": r.get("reasons", [])[:4]}
                  for s, r in zip(seeds, ref, strict=True) if not r.get("passed")][:5]
        checks["reference_solves"] = {"passed": pass_rate >= cfg.reference_min_pass,
                                      "figure": pass_rate,
                                      "threshold": f">= {cfg.reference_min_pass}",
                                      "mean_reward": _mean(r["reward"] for r in ref),
                                      "failures": failed}
        for name in ("null", "random"):
            mean = _mean(r["reward"] for r in results[name])
            checks[f"trivial_{name}"] = {"passed": mean <= cfg.trivial_max_reward,
                                         "figure": mean,
                                         "threshold": f"<= {cfg.trivial_max_reward}",
                                         "pass_rate": _mean(float(bool(r.get("passed")))
                                                            for r in results[name])}
        for name in TRIVIAL_POLICIES:
            mean = _mean(r["reward"] for r in results[name])
            checks[f"loophole_{name}"] = {"passed": mean <= cfg.loophole_max_reward,
                                          "figure": mean,
                                          "threshold": f"<= {cfg.loophole_max_reward}",
                                          "pass_rate": _mean(float(bool(r.get("passed")))
                                                             for r in results[name])}
        distinct = len(set(fingerprints)) / max(1, len(fingerprints))
        checks["distinct_instances"] = {"passed": distinct >= cfg.distinct_min,
                                        "figure": distinct, "threshold": f">= {cfg.distinct_min}"}
        rewards = [r.get("reward") for rs in results.values() for r in rs]
        bad = [x for x in rewards if not isinstance(x, int | float) or not 0.0 <= x <= 1.0]
        checks["reward_range"] = {"passed": not bad, "figure": len(bad),
                                  "threshold": "0 rewards outside [0, 1]",
                                  "examples": [str(b) for b in bad[:3]]}
    except _Stop:
        pass
    except SandboxError as exc:
        checks["sandbox"] = {"passed": False, "figure": exc.kind, "threshold": "no failure",
                             **exc.to_dict()}
    except Exception as exc:  # a bug in the environment's own code
        checks["runtime"] = {"passed": False, "figure": type(exc).__name__,
                             "threshold": "no exception",
                             "message": f"{type(exc).__name__}: {exc}"[:2000]}
    report["checks"] = checks
    report["figures"] = {k: v.get("figure") for k, v in checks.items()}
    report["errors"] = [f"{k}: figure {v.get('figure')} (needs {v.get('threshold')})"
                        + _detail(v) for k, v in checks.items() if not v.get("passed")]
    report["status"] = "validated" if checks and all(c["passed"] for c in checks.values()) \
        else "rejected"
    report["seconds"] = round(time.monotonic() - started, 2)
    return report


def _detail(check: dict[str, Any]) -> str:
    for key in ("message", "problems", "missing", "failures", "mismatched_seeds"):
        if check.get(key):
            return f"; {key}: {json.dumps(check[key], default=str)[:600]}"
    return ""


def _mean(values: Any) -> float:
    vals = [float(v) for v in values]
    return sum(vals) / len(vals) if vals else 0.0


class _Stop(Exception):
    """Stop validating: a check failed that makes the rest meaningless."""


def schema_diff(tools: list[dict[str, Any]], domain: str) -> dict[str, Any]:
    """The environment's tools against the domain's: per-tool verdicts and a unified diff."""
    import difflib

    from trace_lib.envs.domains import get_domain

    original = get_domain(domain).tool_schemas()
    a = json.dumps(original, indent=1, sort_keys=True).splitlines()
    b = json.dumps(tools, indent=1, sort_keys=True).splitlines()
    diff = "\n".join(difflib.unified_diff(a, b, f"{domain} (original)", "environment",
                                          lineterm="", n=2))
    return {"tools": compare_tool_schemas(tools, original), "diff": diff,
            "identical": a == b}
