"""The one file-based environment the tests use: a generated-style module (it defines
`make_env()`, as the environments stage stores them), as code, as a file or as a spec.

    code = file_env_code("toy/say_seed")                 # the module's source
    path = write_file_env(tmp_path, "toy/say_seed")      # a .py file (source "file")
    spec = generated_spec("toy/echo/gen3", reward="exact")  # a stored generated env's spec

Design decisions
- One template, a few knobs, instead of four hand-written copies that drift: the name
  (capability and domain follow from it), the version and how the reply is scored.
- The episode is one turn: the user asks "say SEED"; any action ends it with its
  `content` as the reply (a tool call ends it too, with an empty reply), so a rollout of
  any model is bounded and the reward depends only on the reply's text.
- Scoring (`reward`): "digits" (the share of digits in the reply; passed when the seed is
  in it: a signal a tiny model's random text can move), "exact" (the reply is the seed),
  "zero" (always 0: a group with no signal).
- Always run in the sandbox by the code under test (file and generated sources), never
  imported here: the module is text.
"""

from __future__ import annotations

from pathlib import Path

from trace_lib.envs.registry import EnvSpec

SCORING = {
    "digits": ("reward = sum(c.isdigit() for c in text) / max(len(text), 1)\n"
               "        passed = str(self.seed) in text"),
    "exact": "passed = text == str(self.seed)\n        reward = float(passed)",
    "zero": "reward, passed = 0.0, False",
}

TEMPLATE = '''
class Env:
    name = {name!r}
    capability = {capability!r}
    domain = {domain!r}
    version = {version!r}
    system_prompt = "Answer with the number."
    tool_schemas = []
    hint = None

    def __init__(self):
        self.seed, self.answer = 0, None

    def reset(self, seed):
        self.seed, self.answer = seed, None

    @property
    def messages(self):
        return [{{"role": "system", "content": self.system_prompt}},
                {{"role": "user", "content": f"say {{self.seed}}"}}]

    def step(self, action):
        self.answer = str(action.get("content") or "")
        return "ok"

    @property
    def done(self):
        return self.answer is not None

    def summary(self):
        text = self.answer or ""
        {scoring}
        return {{"reward": reward, "passed": passed, "steps": 1, "reasons": []}}


def make_env():
    return Env()
'''


def _parts(name: str) -> tuple[str, str]:
    """(domain, capability) of "DOMAIN/CAPABILITY[/genN]"."""
    parts = name.split("/")
    return parts[0], parts[1] if len(parts) > 1 else parts[0]


def file_env_code(name: str = "toy/say_seed", *, version: int = 1,
                  reward: str = "digits") -> str:
    """The source of an environment module named `name`, scored by `reward`."""
    domain, capability = _parts(name)
    return TEMPLATE.format(name=name, capability=capability, domain=domain, version=version,
                           scoring=SCORING[reward])


def write_file_env(folder: Path, name: str = "toy/say_seed", *, version: int = 1,
                   reward: str = "digits", filename: str | None = None) -> Path:
    """The module written to `folder` (as `filename`, else the capability's name + .py)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (filename or f"{_parts(name)[1]}_env.py")
    path.write_text(file_env_code(name, version=version, reward=reward))
    return path


def generated_spec(name: str = "toy/say_seed/gen1", *, version: int = 1,
                   reward: str = "digits") -> EnvSpec:
    """The spec of a stored generated environment with this module as its code."""
    domain, capability = _parts(name)
    return EnvSpec(name=name, capability=capability, domain=domain, version=version,
                   source="generated", code=file_env_code(name, version=version, reward=reward))
