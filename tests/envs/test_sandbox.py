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


# ------------------------------------------------------------------ the kernel layer
# Each attack below runs twice: with every layer on (the audit policy reports it as a
# violation) and with the audit policy switched off, to show that bwrap alone contains it
# (the module's own call fails: the host path does not exist in its namespace, or the
# filesystem is read-only). Either way the host's files are unchanged.
KERNEL_ONLY = SandboxLimits(load_timeout_s=8, call_timeout_s=3, cpu_s=20, memory_mb=768,
                            audit_policy=False)

TAMPER = """
import sys
main = sys.modules["__main__"]
for name in ("_BLOCKED_EVENTS", "_PATH_EVENTS", "_TWO_PATH_EVENTS"):
    try:
        getattr(main, name).clear()
    except Exception:
        pass
for name in ("_BLOCKED_PREFIXES", "ALLOWED_STDLIB"):
    try:
        setattr(main, name, ())
    except Exception:
        pass
frame = sys._getframe()
while frame is not None:  # up to the worker: point its idea of 'inside' at /
    owner = frame.f_locals.get("self")
    if owner is not None and hasattr(owner, "workdir"):
        owner.workdir = "/"
        owner.module_path = "/env_module.py"
    frame = frame.f_back
import os
os.path.realpath = lambda p, *a, **k: "/sandbox/work/x"
"""


def _host_files(tmp_path: Path) -> dict[str, Path]:
    canary = tmp_path / "host_file.txt"
    canary.write_text("host data")
    shared = tmp_path / "world_writable"
    shared.mkdir()
    shared.chmod(0o1777)
    db = tmp_path / "trace.duckdb"
    db.write_bytes(b"DUCK" * 1000)
    db.chmod(0o644)
    return {"canary": canary, "shared": shared, "db": db}


def _snapshot(paths: dict[str, Path]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, p in paths.items():
        out[key] = sorted(x.name for x in p.iterdir()) if p.is_dir() else (
            p.read_bytes(), p.stat().st_mtime_ns)
    out["dev_shm"] = sorted(os.listdir("/dev/shm"))
    out["etc_passwd"] = Path("/etc/passwd").read_bytes()
    return out


KERNEL_ATTACKS = {
    # (body, what the kernel says when the audit policy is off)
    "tamper_then_read_passwd": (TAMPER + "return open('/etc/passwd').read()",
                                "No such file or directory"),
    "tamper_then_read_db": (TAMPER + "return open('{db}', 'rb').read(10)",
                            "No such file or directory"),
    "read_world_readable_db": ("return open('{db}', 'rb').read(10)",
                               "No such file or directory"),
    "read_etc_passwd": ("return open('/etc/passwd').read()", "No such file or directory"),
    "write_dev_shm": ("open('/dev/shm/trace-sandbox-escape', 'w').write('x')",
                      "Read-only file system"),
    "write_world_writable_dir": ("open('{shared}/dropped', 'w').write('x')",
                                 "No such file or directory"),
    "overwrite_own_module": ("open('/sandbox/module/env_module.py', 'w').write('x')",
                             "Read-only file system"),
    "write_root": ("open('/escape', 'w').write('x')", "Read-only file system"),
}


@pytest.mark.parametrize("policy", ["audit-on", "kernel-only"])
@pytest.mark.parametrize("attack", sorted(KERNEL_ATTACKS))
def test_kernel_layer_contains_the_attack(attack, policy, tmp_path):
    files = _host_files(tmp_path)
    before = _snapshot(files)
    body, kernel_says = KERNEL_ATTACKS[attack]
    code = hostile(body.format(db=files["db"], shared=files["shared"]))
    box = Sandbox(code, LIMITS if policy == "audit-on" else KERNEL_ONLY)
    with pytest.raises(SandboxError) as err:
        box.start()
    pid = box.pid
    box.close()
    if policy == "audit-on":
        assert err.value.kind == "violation" and err.value.violations, err.value
    else:  # reported: the module's failing call, with the kernel's reason
        assert err.value.kind == "error" and kernel_says in err.value.message, err.value
    assert pid is not None and not _alive(pid)
    assert _snapshot(files) == before


def test_disk_filling_hits_the_quota_and_is_reported():
    limits = SandboxLimits(load_timeout_s=20, call_timeout_s=15, cpu_s=20, memory_mb=768,
                           disk_mb=8, file_mb=4)
    fill = ("chunk = b'x' * 1_000_000\n"
            "for i in range(1000):\n"
            "    with open(f'fill{i}', 'wb') as fh:\n"
            "        for _ in range(4):\n"
            "            fh.write(chunk)\n")
    box = Sandbox(hostile(fill), limits)
    with pytest.raises(SandboxError) as err:
        box.start()
    box.close()
    assert err.value.kind == "violation", err.value
    assert any(v["event"] == "disk-quota" for v in err.value.violations), err.value


def test_a_full_disk_is_reported_even_when_the_module_hides_the_error():
    limits = SandboxLimits(load_timeout_s=20, call_timeout_s=15, cpu_s=20, memory_mb=768,
                           disk_mb=8, file_mb=4)
    fill = ("for i in range(1000):\n"
            "    try:\n"
            "        with open(f'fill{i}', 'wb') as fh:\n"
            "            fh.write(b'x' * 3_000_000)\n"
            "    except OSError:\n"
            "        break\n")
    code = hostile(fill).replace("def make_env():", "def _fill():") + GOOD.replace(
        "    return Env()", "    _fill()\n    return Env()")
    box = Sandbox(code, limits)
    with pytest.raises(SandboxError) as err:
        box.start()
    box.close()
    assert err.value.kind == "violation", err.value
    assert [v["event"] for v in err.value.violations] == ["disk-quota"]


@pytest.mark.parametrize("policy", ["audit-on", "kernel-only"])
def test_one_sandbox_cannot_reach_another(policy):
    with Sandbox(GOOD, LIMITS) as victim:
        target = victim.workdir / "env_module.py"
        before = target.read_bytes()
        pids = (victim.pid, victim._child_pid or victim.pid)
        attack = (
            "import os\n"
            f"for pid in {pids}:\n"
            "    try:\n"
            "        os.kill(pid, 9)\n"
            "    except Exception:\n"
            "        pass\n"
            "seen = os.listdir('/proc')\n"
            f"open('{target}', 'w').write('def make_env():\\n    raise SystemExit(1)\\n')\n"
        )
        box = Sandbox(hostile(attack), LIMITS if policy == "audit-on" else KERNEL_ONLY)
        with pytest.raises(SandboxError) as err:
            box.start()
        box.close()
        assert err.value.kind in {"violation", "error"}, err.value
        if policy == "kernel-only":
            assert "No such file or directory" in err.value.message
        # the victim still serves, from its own unchanged module
        assert victim.alive and target.read_bytes() == before
        victim.call("reset", seed=3)
        assert victim.call("summary")["passed"] is False


GARBAGE = {
    "integer": "42",
    "list": "[1, 2, 3]",
    "string": '"ok"',
    "not_json": "{ this is not json",
    "violation_not_object": '{"violation": 7}',
    "oversized": "[" + "1," * 5_000_000 + "1]",
}


@pytest.mark.parametrize("garbage", sorted(GARBAGE))
def test_garbage_on_the_protocol_pipe_is_a_reported_violation(garbage):
    attack = (
        "import sys\n"
        "frame = sys._getframe()\n"
        "while frame is not None:\n"
        "    owner = frame.f_locals.get('self')\n"
        "    if owner is not None and hasattr(owner, 'proto'):\n"
        f"        owner.proto.write({GARBAGE[garbage]!r} + '\\n')\n"
        "        owner.proto.flush()\n"
        "        break\n"
        "    frame = frame.f_back\n"
    )
    limits = SandboxLimits(load_timeout_s=8, call_timeout_s=3, cpu_s=20, memory_mb=768,
                           max_line_mb=1)
    code = hostile(attack).replace("def make_env():", "def _attack():") + GOOD.replace(
        "    return Env()", "    _attack()\n    return Env()")
    box = Sandbox(code, limits)
    with pytest.raises(SandboxError) as err:
        box.start()
    pid = box.pid
    box.close()
    assert err.value.kind == "violation", err.value
    assert err.value.violations and err.value.violations[-1]["event"] == "protocol"
    assert pid is not None and not _alive(pid)


def test_without_bwrap_generated_code_is_refused_unless_unsafe_is_asked(monkeypatch):
    from trace_lib.envs import sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "bwrap_path", lambda: None)
    with pytest.raises(sandbox_module.SandboxUnavailable, match="--unsafe-local-sandbox"):
        Sandbox(GOOD, LIMITS).start()
    unsafe = SandboxLimits(load_timeout_s=8, call_timeout_s=3, cpu_s=20, memory_mb=768,
                           unsafe_local=True)
    with Sandbox(GOOD, unsafe) as box:
        assert "UNSAFE-no-kernel-boundary" in box.info["layers"]
        assert "audit-policy" in box.info["layers"]
    with pytest.raises(ValueError):
        Sandbox(GOOD, SandboxLimits(unsafe_local=True, audit_policy=False)).start()


def test_the_kernel_layers_are_reported():
    with Sandbox(GOOD, LIMITS) as box:
        layers = box.info["layers"]
    assert layers[0].startswith("kernel-namespaces") and "tmpfs-workdir-quota" in layers
