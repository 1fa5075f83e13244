"""Run untrusted environment code in a confined subprocess and speak to it over JSON lines.

    with Sandbox(code) as box:                 # starts the worker, loads the module
        env = SandboxedEnvironment(box)        # the Environment protocol, proxied
        env.reset(3); env.step({"name": "get_user_details", "arguments": {...}})

Design decisions
- Generated code is never imported into the host. It runs in `sandbox_worker.py`, a child
  started with a scrubbed environment (no API keys, no PYTHONPATH, PYTHONHASHSEED=0 so that
  set/dict order cannot break determinism), its own temporary directory as cwd and HOME,
  and its own process group. The confinement layers live in the worker's docstring; the
  host adds the one a child cannot bypass: a wall-clock deadline per request, after which
  the whole process group is SIGKILLed.
- Any violation, timeout, memory exhaustion or crash ends the worker: a module caught
  misbehaving is not trusted to keep serving. Errors raised by the module's own code
  (a bug in `step`) are returned as `SandboxError(kind="error")` and the worker lives on,
  so validation can report them.
- The worker writes its protocol on a private pipe and its prints to a stderr file owned
  by the host; the tail of that file goes into crash reports.
- One class, `SandboxedEnvironment`, turns a live sandbox into an object that satisfies
  the Environment protocol, so validation, calibration and the page treat built-in and
  generated environments alike.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

LIBRARY_ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("sandbox_worker.py")
NOBODY = 65534


@dataclass
class SandboxLimits:
    load_timeout_s: float = 30.0  # starting the interpreter and importing the library
    call_timeout_s: float = 10.0  # one reset/step/summary
    cpu_s: int = 120  # CPU seconds for the worker's whole life
    memory_mb: int = 1024  # address space
    file_mb: int = 16  # largest file it may write (in its own directory)
    isolate_network: bool = True  # a fresh network namespace when running as root


class SandboxError(RuntimeError):
    """The sandboxed module failed; `kind` says how.

    kind: violation | timeout | memory | crashed | error | exit | protocol
    """

    def __init__(self, kind: str, message: str, violations: list[dict] | None = None) -> None:
        super().__init__(f"[{kind}] {message}")
        self.kind = kind
        self.message = message
        self.violations = violations or []

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "violations": self.violations}


class Sandbox:
    """One worker process serving one environment module."""

    def __init__(self, code: str, limits: SandboxLimits | None = None) -> None:
        self.code = code
        self.limits = limits or SandboxLimits()
        self.proc: subprocess.Popen | None = None
        self.workdir: Path | None = None
        self.stderr_path: Path | None = None
        self.violations: list[dict] = []
        self.info: dict[str, Any] = {}
        self._buf = b""

    # ------------------------------------------------------------------ lifetime
    def start(self) -> dict[str, Any]:
        """Start the worker and load the module; returns its description and layers."""
        self.workdir = Path(tempfile.mkdtemp(prefix="trace-sandbox-"))
        (self.workdir / "env_module.py").write_text(self.code, encoding="utf-8")
        if os.geteuid() == 0:
            os.chown(self.workdir, NOBODY, NOBODY)
        fd, stderr_name = tempfile.mkstemp(prefix="trace-sandbox-stderr-")
        self.stderr_path = Path(stderr_name)
        worker_limits = ("cpu_s", "memory_mb", "file_mb", "isolate_network")
        config = {
            "workdir": str(self.workdir),
            "library_root": str(LIBRARY_ROOT),
            **{k: v for k, v in asdict(self.limits).items() if k in worker_limits},
        }
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.workdir),
            "TMPDIR": str(self.workdir),
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "LANG": "C.UTF-8",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-s", "-B", str(WORKER), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=fd,
            cwd=str(self.workdir),
            env=env,
            start_new_session=True,  # its own process group: one killpg ends everything
            close_fds=True,
        )
        os.close(fd)
        self.info = self._request({"op": "load"}, self.limits.load_timeout_s)
        return self.info

    def close(self) -> None:
        """End the worker (politely, then by force) and remove its directory."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                try:
                    proc.stdin.write(b'{"op": "exit"}\n')
                    proc.stdin.flush()
                    proc.wait(timeout=1.0)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill(proc)
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        if self.stderr_path is not None:
            self.stderr_path.unlink(missing_ok=True)
            self.stderr_path = None

    def __enter__(self) -> Sandbox:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten sandbox must not outlive its owner
        try:
            self.close()
        except Exception:
            pass

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    # ------------------------------------------------------------------ requests
    def call(self, op: str, **payload: Any) -> Any:
        return self._request({"op": op, **payload}, self.limits.call_timeout_s)

    def _request(self, req: dict[str, Any], timeout_s: float) -> Any:
        if self.proc is None or self.proc.poll() is not None:
            raise SandboxError("crashed", "the sandbox worker is not running" + self._tail())
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode("utf-8"))
            self.proc.stdin.flush()
        except OSError as exc:
            self._fail("crashed", f"could not write to the worker: {exc}")
        deadline = time.monotonic() + timeout_s
        while True:
            line = self._readline(deadline, req.get("op", "?"), timeout_s)
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                self._fail("protocol", f"the worker sent a line that is not JSON: {line[:200]!r}")
            if "violation" in msg:
                self.violations.append(msg["violation"])
                continue  # the response to the request follows
            break
        if msg.get("ok"):
            if self.violations:
                # The module caught the refusal and carried on: still a violation.
                self._fail("violation", self._violation_text())
            return msg.get("result")
        kind = msg.get("kind", "error")
        if self.violations or kind == "violation":
            self._fail("violation", self._violation_text() or msg.get("error", ""))
        if kind in ("memory", "exit", "protocol"):
            self._fail(kind, msg.get("error", ""))
        raise SandboxError(kind, msg.get("error", ""))

    def _readline(self, deadline: float, op: str, timeout_s: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail("timeout", f"{op!r} took longer than {timeout_s:g}s; worker killed")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                self.proc.wait(timeout=5)
                code = self.proc.returncode
                why = _describe_exit(code)
                kind = "memory" if "MemoryError" in self._tail() else "crashed"
                self._fail(kind, f"the worker died during {op!r}: {why}{self._tail()}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode("utf-8", errors="replace")

    def _fail(self, kind: str, message: str) -> None:
        violations = list(self.violations)
        proc = self.proc
        if proc is not None:
            self._kill(proc)
        raise SandboxError(kind, message, violations)

    def _violation_text(self) -> str:
        return "; ".join(f"{v.get('event')}: {v.get('detail')}" for v in self.violations)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def _tail(self, n: int = 1200) -> str:
        if self.stderr_path is None or not self.stderr_path.exists():
            return ""
        text = self.stderr_path.read_text(encoding="utf-8", errors="replace")[-n:]
        return f"\n--- worker stderr ---\n{text}" if text.strip() else ""


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        extra = " (CPU time limit)" if name == "SIGXCPU" else ""
        return f"killed by {name}{extra}"
    return f"exit status {code}"


class SandboxedEnvironment:
    """The Environment protocol over a live `Sandbox` (generated code stays in the child)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self._desc: dict[str, Any] = dict(sandbox.info)
        self.name = self._desc.get("name", "generated")
        self.capability = self._desc.get("capability", "")
        self.domain = self._desc.get("domain", "")
        self.version = int(self._desc.get("version", 1) or 1)

    @classmethod
    def from_code(cls, code: str, limits: SandboxLimits | None = None) -> SandboxedEnvironment:
        box = Sandbox(code, limits)
        try:
            box.start()
        except BaseException:
            box.close()
            raise
        return cls(box)

    def close(self) -> None:
        self.sandbox.close()

    def __enter__(self) -> SandboxedEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self, seed: int) -> None:
        self._desc = self.sandbox.call("reset", seed=int(seed))

    def _get(self, key: str) -> Any:
        if key not in self._desc:  # asked before reset: the module's own answer, if any
            self._desc.update(self.sandbox.call("describe"))
        return self._desc[key]

    @property
    def system_prompt(self) -> str:
        return self._get("system_prompt")

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return self._get("tool_schemas")

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self._get("messages")

    @property
    def hint(self) -> str | None:
        return self._desc.get("hint")

    @property
    def done(self) -> bool:
        return bool(self._desc.get("done"))

    @property
    def ground_truth(self) -> Any:
        return self.sandbox.call("ground_truth")

    def step(self, action: str | dict[str, Any]) -> str:
        out = self.sandbox.call("step", action=action)
        self._desc["done"] = bool(out.get("done"))
        return out.get("observation")

    def summary(self) -> dict[str, Any]:
        return self.sandbox.call("summary")

    def reference_action(self) -> dict[str, Any] | None:
        return self.sandbox.call("reference_action")

    @property
    def layers(self) -> list[str]:
        return list(self.sandbox.info.get("layers", []))
