"""Run untrusted environment code in a confined subprocess and speak to it over JSON lines.

    with Sandbox(code) as box:                 # starts the worker, loads the module
        env = SandboxedEnvironment(box)        # the Environment protocol, proxied
        env.reset(3); env.step({"name": "get_user_details", "arguments": {...}})

Design decisions
- Generated code is never imported into the host. It runs in `sandbox_worker.py`, a child
  whose confinement does not depend on the child's good will: the worker runs under
  bubblewrap (`bwrap`) with new user, mount, PID, IPC, UTS and network namespaces. Its
  filesystem is an empty root holding only the interpreter (its prefix, the shared
  libraries under /usr, and the few site-packages the whitelist needs), the library's
  `trace_lib` folder and the module's own folder, all read-only, plus a size-limited tmpfs
  workdir (the disk quota) and a /dev without the host's /dev/shm. So the DuckDB file,
  /etc/passwd, other sandboxes' folders and world-writable host directories do not exist
  for it; it sees only its own processes; `--die-with-parent` ends it with the host.
  Inside, the worker adds rlimits and the audit-hook policy (defence in depth, and the
  source of precise reports); the host adds the wall-clock deadline per request, after
  which the whole process group is SIGKILLed.
- Without bwrap (a laptop without the package) generated code is refused, unless the caller
  passes `unsafe_local=True` (`--unsafe-local-sandbox`): then the old in-process layers run
  alone (audit hook, rlimits, uid nobody and a network namespace when root), which is no
  security boundary and is reported as such in `layers`.
- Every sandbox has its own namespaces, host folder and tmpfs: two concurrent sandboxes
  cannot see each other's files or processes. The host checks the tmpfs from outside after
  each request (through /proc/PID/root of the worker), so a module that fills its quota and
  swallows the error is still reported.
- The environment is scrubbed (no API keys, no PYTHONPATH; PYTHONHASHSEED=0 so that
  set/dict order cannot break determinism); `python -I -S` ignores site and user paths.
- Any violation, timeout, memory exhaustion, crash or protocol abuse ends the worker: a
  module caught misbehaving is not trusted to keep serving. Errors raised by the module's
  own code (a bug in `step`) are returned as `SandboxError(kind="error")` and the worker
  lives on, so validation can report them.
- The protocol reader trusts nothing: a line that is not JSON, not an object, or longer
  than `max_line_mb` is a violation with a report, never a host exception.
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
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from trace_lib.errors import UserInputError

LIBRARY_ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("sandbox_worker.py")
NOBODY = 65534
UNSAFE_ENV = "TRACE_UNSAFE_LOCAL_SANDBOX"  # "1": what --unsafe-local-sandbox sets for children
# Inside the bwrap namespace: where the module's folder and the tmpfs workdir appear.
BOX_MODULE_DIR = "/sandbox/module"
BOX_WORKDIR = "/sandbox/work"
# The third-party packages the worker's whitelist imports (pydantic and what it needs).
SITE_PACKAGES_NEEDED = (
    "pydantic", "pydantic_core", "typing_extensions.py", "annotated_types",
    "typing_inspection",
)


def _unsafe_default() -> bool:
    return os.environ.get(UNSAFE_ENV, "") == "1"


@dataclass
class SandboxLimits:
    load_timeout_s: float = 30.0  # starting the interpreter and importing the library
    call_timeout_s: float = 10.0  # one reset/step/summary
    cpu_s: int = 120  # CPU seconds for the worker's whole life
    memory_mb: int = 1024  # address space
    file_mb: int = 16  # largest file it may write (in its own directory)
    disk_mb: int = 32  # the workdir's tmpfs: all files together (the disk quota)
    max_line_mb: int = 8  # longest protocol line the host reads
    isolate_network: bool = True  # unsafe mode only: a network namespace when root
    # Run without bwrap (audit hook + rlimits only: NOT a security boundary). Off unless the
    # user asks with --unsafe-local-sandbox (or TRACE_UNSAFE_LOCAL_SANDBOX=1 in a child).
    unsafe_local: bool = field(default_factory=_unsafe_default)
    # Tests of the kernel layer switch the audit hook off to show bwrap holds alone.
    audit_policy: bool = True


class SandboxUnavailable(UserInputError):
    """bwrap is missing or cannot create namespaces here, and unsafe mode was not asked for
    (a UserInputError: the CLI and the pages show the message as it is)."""


def allow_unsafe_local(allow: bool = True) -> None:
    """What `--unsafe-local-sandbox` does: later sandboxes in this process and in the jobs it
    starts run without bwrap (audit hook and rlimits only; NOT a security boundary)."""
    if allow:
        os.environ[UNSAFE_ENV] = "1"
    else:
        os.environ.pop(UNSAFE_ENV, None)


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _bwrap_probe(bwrap: str) -> str | None:
    """None if bwrap can create the namespaces we use here, else why not."""
    try:
        out = subprocess.run(
            [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net",
             "--unshare-uts", "--uid", str(NOBODY), "--gid", str(NOBODY),
             "--ro-bind", "/", "/", "--die-with-parent", "/bin/true"],
            capture_output=True, text=True, timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if out.returncode == 0 else (out.stderr.strip() or f"exit {out.returncode}")


_PROBE: dict[str, str | None] = {}


def kernel_sandbox_problem() -> str | None:
    """None when the bwrap sandbox works on this machine, else a sentence saying why not."""
    bwrap = bwrap_path()
    if bwrap is None:
        return ("bubblewrap (bwrap) is not installed: `apt-get install bubblewrap` "
                "(or `make test`, which installs it)")
    if bwrap not in _PROBE:
        _PROBE[bwrap] = _bwrap_probe(bwrap)
    problem = _PROBE[bwrap]
    return None if problem is None else f"bwrap cannot create namespaces here: {problem}"


def _interpreter() -> tuple[str, list[str]]:
    """The real interpreter binary and the read-only trees it needs (prefix, site-packages)."""
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable) or sys.executable)
    trees = {os.path.realpath(sys.base_prefix)}
    purelib = sysconfig.get_paths()["purelib"]
    for name in SITE_PACKAGES_NEEDED:
        path = os.path.join(purelib, name)
        if os.path.exists(path):
            trees.add(os.path.realpath(path))
    return exe, sorted(trees)


def bwrap_command(bwrap: str, host_module_dir: Path, limits: SandboxLimits, info_fd: int,
                  worker_args: list[str]) -> list[str]:
    """The bwrap argv: empty root, read-only interpreter + library + module, tmpfs workdir."""
    exe, trees = _interpreter()
    cmd = [
        bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net",
        "--unshare-uts", "--unshare-cgroup-try", "--uid", str(NOBODY), "--gid", str(NOBODY),
        "--die-with-parent", "--new-session", "--info-fd", str(info_fd),
        "--ro-bind", "/usr", "/usr",
    ]
    for top in ("/bin", "/lib", "/lib64", "/sbin"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    for tree in trees:
        cmd += ["--ro-bind", tree, tree]
    lib = str(LIBRARY_ROOT / "trace_lib")
    cmd += [
        "--ro-bind", lib, lib,
        "--ro-bind", str(host_module_dir), BOX_MODULE_DIR,
        "--proc", "/proc",
        "--dev", "/dev",  # null, zero, urandom...; its /dev/shm is not the host's
        "--size", str(limits.disk_mb * 1024 * 1024), "--tmpfs", BOX_WORKDIR,
        "--remount-ro", "/dev",  # nothing writable in /dev (so no /dev/shm at all)
        "--remount-ro", "/",  # the root tmpfs too: the workdir is the only writable place
        "--chdir", BOX_WORKDIR, "--clearenv",
    ]
    for key, value in _child_env(BOX_WORKDIR).items():
        cmd += ["--setenv", key, value]
    return [*cmd, "--", exe, "-I", "-S", "-B", *worker_args]


def _child_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
    }


class SandboxError(RuntimeError):
    """The sandboxed module failed; `kind` says how.

    kind: violation | timeout | memory | crashed | error | exit | protocol
    (protocol abuse and a full disk quota are violations, with an entry in `violations`).
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
        self._child_pid: int | None = None  # the worker inside bwrap, as the host sees it
        self._info_fd = -1  # bwrap's --info-fd pipe, read once it has written the pid

    # ------------------------------------------------------------------ lifetime
    def start(self) -> dict[str, Any]:
        """Start the worker and load the module; returns its description and layers."""
        limits = self.limits
        if limits.unsafe_local and not limits.audit_policy:
            raise ValueError("unsafe_local without the audit policy would run code unconfined")
        problem = None if limits.unsafe_local else kernel_sandbox_problem()
        if problem is not None:
            raise SandboxUnavailable(
                f"generated code is not run without a kernel sandbox: {problem}. To run it "
                "anyway with only the in-process audit hook (no security boundary), pass "
                "--unsafe-local-sandbox."
            )
        self.workdir = Path(tempfile.mkdtemp(prefix="trace-sandbox-"))
        (self.workdir / "env_module.py").write_text(self.code, encoding="utf-8")
        fd, stderr_name = tempfile.mkstemp(prefix="trace-sandbox-stderr-")
        self.stderr_path = Path(stderr_name)
        worker_limits = ("cpu_s", "memory_mb", "file_mb", "isolate_network", "audit_policy")
        config: dict[str, Any] = {
            "library_root": str(LIBRARY_ROOT),
            "site_packages": sysconfig.get_paths()["purelib"],
            **{k: v for k, v in asdict(limits).items() if k in worker_limits},
        }
        pass_fds: tuple[int, ...] = ()
        info_r = info_w = -1
        if limits.unsafe_local:
            if os.geteuid() == 0:
                os.chown(self.workdir, NOBODY, NOBODY)
            config.update(workdir=str(self.workdir), module_dir=str(self.workdir),
                          mode="unsafe-local")
            argv = [sys.executable, "-s", "-B", str(WORKER), json.dumps(config)]
            env, cwd = _child_env(str(self.workdir)), str(self.workdir)
        else:
            config.update(workdir=BOX_WORKDIR, module_dir=BOX_MODULE_DIR, mode="bwrap")
            info_r, info_w = os.pipe()
            pass_fds = (info_w,)
            argv = bwrap_command(bwrap_path() or "bwrap", self.workdir, limits, info_w,
                                 [str(WORKER), json.dumps(config)])
            env, cwd = {"PATH": "/usr/bin:/bin"}, str(self.workdir)
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=fd,
                cwd=cwd,
                env=env,
                start_new_session=True,  # its own process group: one killpg ends everything
                close_fds=True,
                pass_fds=pass_fds,
            )
        finally:
            os.close(fd)
            if info_w >= 0:
                os.close(info_w)
        self._info_fd = info_r
        self.info = self._request({"op": "load"}, limits.load_timeout_s)
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
        if self._info_fd >= 0:
            os.close(self._info_fd)
            self._info_fd = -1

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
        op = str(req.get("op", "?"))
        while True:
            msg = self._read_message(deadline, op, timeout_s)
            if "violation" in msg:
                violation = msg["violation"]
                if not isinstance(violation, dict):
                    violation = {"event": "protocol", "detail": repr(violation)[:300]}
                self.violations.append(violation)
                continue  # the response to the request follows
            break
        self._check_quota(op)
        if msg.get("ok") is True:
            if self.violations:
                # The module caught the refusal and carried on: still a violation.
                self._fail("violation", self._violation_text())
            return msg.get("result")
        kind = str(msg.get("kind", "error"))
        error = str(msg.get("error", ""))
        if self.violations or kind == "violation":
            self._fail("violation", self._violation_text() or error)
        if "No space left on device" in error or "File too large" in error:
            self._protocol_violation("disk-quota", f"the module hit its disk quota "
                                     f"({self.limits.disk_mb} MB workdir, {self.limits.file_mb}"
                                     f" MB per file): {error[-300:]}")
        if kind in ("memory", "exit", "protocol"):
            self._fail(kind, error)
        raise SandboxError(kind, error)

    def _read_message(self, deadline: float, op: str, timeout_s: float) -> dict[str, Any]:
        """One protocol line as a JSON object; anything else is a reported violation."""
        line = self._readline(deadline, op, timeout_s)
        try:
            msg = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            self._protocol_violation("protocol", f"during {op!r} the worker sent a line that is "
                                     f"not JSON: {line[:200]!r}")
        if not isinstance(msg, dict):
            self._protocol_violation("protocol", f"during {op!r} the worker sent "
                                     f"{type(msg).__name__} where an object belongs: "
                                     f"{line[:200]!r}")
        return msg

    def _protocol_violation(self, event: str, detail: str) -> NoReturn:
        self.violations.append({"event": event, "detail": detail[:300]})
        self._fail("violation", self._violation_text())

    def _check_quota(self, op: str) -> None:
        """Seen from outside: a full workdir is a violation even if the module hid the error."""
        if self._info_fd >= 0:
            self._child_pid = _read_child_pid(self._info_fd)
            os.close(self._info_fd)
            self._info_fd = -1
        if self._child_pid is None:
            return
        try:
            st = os.statvfs(f"/proc/{self._child_pid}/root{BOX_WORKDIR}")
        except OSError:
            return  # the worker is gone; the next request reports that
        if st.f_bfree * st.f_frsize < 64 * 1024:
            self._protocol_violation("disk-quota", f"during {op!r} the module filled its "
                                     f"{self.limits.disk_mb} MB workdir")

    def _readline(self, deadline: float, op: str, timeout_s: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        max_bytes = self.limits.max_line_mb * 1024 * 1024
        while b"\n" not in self._buf:
            if len(self._buf) > max_bytes:
                self._buf = b""
                self._protocol_violation("protocol", f"during {op!r} the worker sent a line "
                                         f"longer than {self.limits.max_line_mb} MB")
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
        if len(line) > max_bytes:
            self._protocol_violation("protocol", f"during {op!r} the worker sent a line "
                                     f"longer than {self.limits.max_line_mb} MB")
        return line.decode("utf-8", errors="replace")

    def _fail(self, kind: str, message: str) -> NoReturn:
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


def _read_child_pid(fd: int) -> int | None:
    """bwrap's --info-fd document ({"child-pid": N}), if it wrote one; never blocks."""
    ready, _, _ = select.select([fd], [], [], 0)
    if not ready:
        return None
    try:
        data = json.loads(os.read(fd, 65536).decode("utf-8", errors="replace") or "{}")
        pid = data.get("child-pid") if isinstance(data, dict) else None
        return int(pid) if isinstance(pid, int) else None
    except (OSError, ValueError):
        return None


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if 128 < code < 128 + 65:
        code = 128 - code  # bwrap exits with 128+N when its child died of signal N
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
