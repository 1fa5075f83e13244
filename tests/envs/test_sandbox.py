"""The sandbox contains hostile modules: each is stopped and reported, the host untouched."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from trace_lib.envs.sandbox import Sandbox, SandboxedEnvironment, SandboxError, SandboxLimits

GOOD = textwrap.dedent('''
    class Env:
        name = "test/echo"; capability = "echo"; domain = "airline"; version = 1
        system_prompt = "be brief"; tool_schemas = []; hint = None

        def __init__(self):
            self.seed = None
            self.done = False
            self.answer = None

        @property
        def messages(self):
            return [{"role": "user", "content": f"say {self.seed}"}]

        def reset(self, seed):
            self.seed, self.done, self.answer = seed, False, None

        def step(self, action):
            print("stdout noise must not break the protocol")
            self.answer = action.get("content")
            self.done = True
            return "ok"

        def summary(self):
            ok = self.answer == str(self.seed)
            return {"reward": float(ok), "passed": ok, "steps": 1, "reasons": []}

    def make_env():
        return Env()
''')

LIMITS = SandboxLimits(load_timeout_s=8, call_timeout_s=3, cpu_s=20, memory_mb=768)


def hostile(body: str) -> str:
    """A module whose make_env() does `body` (the attack runs when the host loads it)."""
    return "def make_env():\n" + textwrap.indent(textwrap.dedent(body), "    ") + "\n"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not running; the host reaps its child in close().
    return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_good_module_serves_the_protocol():
    env = SandboxedEnvironment.from_code(GOOD, LIMITS)
    try:
        assert "audit-policy" in env.layers and "rlimits" in env.layers
        env.reset(7)
        assert env.messages == [{"role": "user", "content": "say 7"}]
        assert env.step({"content": "7"}) == "ok"
        assert env.done
        assert env.summary()["passed"] is True
        pid = env.sandbox.pid
    finally:
        env.close()
    assert not _alive(pid)


def test_module_errors_are_reported_and_the_worker_lives_on():
    code = GOOD.replace('self.answer = action.get("content")', 'raise KeyError("boom")')
    with Sandbox(code, LIMITS) as box:
        box.call("reset", seed=1)
        with pytest.raises(SandboxError) as err:
            box.call("step", action={"content": "1"})
        assert err.value.kind == "error" and "KeyError" in err.value.message
        assert box.alive
        assert box.call("summary")["passed"] is False


def test_secrets_do_not_reach_the_worker(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret-value")
    code = GOOD.replace('name = "test/echo"', 'import os\n    name = os.environ.get('
                        '"ANTHROPIC_API_KEY", "no key")')
    with Sandbox(code, LIMITS) as box:
        assert box.info["name"] == "no key"


ATTACKS = {
    "infinite_loop": ("while True:\n    pass", {"timeout"}),
    "memory_bomb": ("blocks = []\nwhile True:\n    blocks.append(bytearray(50_000_000))",
                    {"memory", "crashed"}),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()", {"violation"}),
    "socket": ("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))",
               {"violation"}),
    "socket_preloaded": ("import sys\nsock = sys.modules.get('_socket') or __import__('_socket')"
                         "\nsock.socket()", {"violation"}),
    "os_system": ("import os\nos.system('touch {canary}.system')", {"violation"}),
    "subprocess": ("import subprocess\nsubprocess.run(['touch', '{canary}.sub'])",
                   {"violation"}),
    "read_outside": ("return open('{canary}').read()", {"violation"}),
    "write_outside": ("open('{canary}', 'w').write('owned')", {"violation"}),
    "delete_outside": ("import os\nos.remove('{canary}')", {"violation"}),
    "list_outside": ("import os\nreturn os.listdir('{canary_dir}')", {"violation"}),
    "caught_violation": ("try:\n    open('{canary}').read()\nexcept Exception:\n    pass\n"
                         "return None", {"violation"}),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_hostile_module_is_stopped_and_reported(attack, tmp_path):
    canary = tmp_path / "host_file.txt"
    canary.write_text("host data")
    before = canary.stat()
    body, kinds = ATTACKS[attack]
    code = hostile(body.format(canary=canary, canary_dir=tmp_path))
    box = Sandbox(code, LIMITS)
    with pytest.raises(SandboxError) as err:
        box.start()
    pid = box.pid
    box.close()
    # stopped: the worker is gone; reported: the error says what happened
    assert err.value.kind in kinds, err.value
    if err.value.kind == "violation":
        assert err.value.violations, "a violation names the blocked operation"
    assert pid is not None and not _alive(pid)
    # the host and its files are untouched
    assert canary.read_text() == "host data"
    assert canary.stat().st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host_file.txt"]
    assert os.getpid() > 0


def test_cpu_limit_backs_up_the_wall_clock():
    limits = SandboxLimits(load_timeout_s=60, call_timeout_s=60, cpu_s=2, memory_mb=768)
    box = Sandbox(hostile("while True:\n    pass"), limits)
    with pytest.raises(SandboxError) as err:
        box.start()
    box.close()
    assert err.value.kind == "crashed" and "SIGXCPU" in err.value.message


def test_sandbox_directory_is_removed():
    box = Sandbox(GOOD, LIMITS)
    box.start()
    workdir = box.workdir
    assert workdir is not None and (workdir / "env_module.py").exists()
    box.close()
    assert not workdir.exists()
