"""The sandbox's child process: loads one untrusted environment module and serves it.

Run only by `trace_lib.envs.sandbox` as `python -s -B sandbox_worker.py CONFIG_JSON`; never
imported by the host. It speaks JSON lines: one request per line on stdin
({"op": ..., ...}), one response per line on the protocol stream ({"ok": true, "result": ...}
or {"ok": false, "error": ..., "kind": ...}). A blocked operation also writes an unsolicited
{"violation": ...} line the moment it happens, so code that later tampers with this
module's state cannot take the report back.

Design decisions
- Layers, strongest first. (1) Kernel (the host starts this file under bubblewrap): new
  user, mount, PID, IPC, UTS and network namespaces, uid `nobody`, a read-only root that
  holds only the interpreter, `trace_lib` and the module's folder, and a size-limited tmpfs
  workdir. This layer holds even if every layer below is switched off by the module.
  (2) rlimits: address space, CPU seconds, file size, open files, no core dumps,
  RLIMIT_NPROC=0. (3) A `sys.addaudithook` policy: opening, listing, renaming or deleting
  any path outside the workdir and the module's folder, sockets, process creation
  (`os.system`, `os.fork`, exec, spawn, `subprocess`), ctypes, signals to other processes,
  changing rlimits, tracing and gc walks are refused and reported. (4) The host's
  wall-clock timeout kills the whole process group. In unsafe-local mode (no bwrap, asked
  for explicitly) layer 1 is replaced by uid `nobody` and a network namespace when root,
  and the report says that there is no kernel boundary.
- The policy's data lives in the hook's closure (frozensets and a captured workdir string),
  never in module globals or on the `Worker` object: a module that reaches
  `sys.modules["__main__"]` or walks frames up to the worker finds nothing to clear, and
  the functions the hook calls are captured at install time, so patching `os.path` does not
  move its idea of "inside". It is still Python in the same process; layer 1 is the
  boundary, this layer is for precise reports.
- Everything the module may import is imported BEFORE the policy is installed. Importing
  anything else is a violation, so the module's reach is the whitelist. Dangerous modules
  the host happened to load are dropped from `sys.modules`.
- The protocol stream is a private duplicate of fd 1; fd 1 itself is pointed at stderr,
  so a module that prints cannot corrupt the protocol (the host also rejects any line that
  is not a JSON object).
- Tracebacks are formatted without reading source lines: `linecache` would try to open
  files outside the sandbox directory, which the policy (rightly) refuses.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

# ---------------------------------------------------------------- allowed imports
# Standard-library modules an environment module may use, plus the trusted library code
# it builds on. Imported up front; nothing else can be imported once the policy is on.
ALLOWED_STDLIB = (
    "abc", "bisect", "collections", "collections.abc", "copy", "dataclasses", "datetime",
    "decimal", "enum", "fractions", "functools", "hashlib", "heapq", "itertools", "json",
    "math", "operator", "random", "re", "statistics", "string", "textwrap", "typing",
)
ALLOWED_LIBRARY = (
    "pydantic",
    "trace_lib.envs.protocol",
    "trace_lib.envs.domains",
    "trace_lib.envs.domains.airline",
    "trace_lib.envs.domains.retail",
    "trace_lib.envs.capabilities",
    "trace_lib.envs.capabilities.task_env",
    "trace_lib.envs.capabilities.instances",
    "trace_lib.envs.capabilities.structured_data_reasoning",
    "trace_lib.envs.capabilities.multi_step_task_completion",
    "trace_lib.envs.capabilities.precondition_verification",
    "trace_lib.envs.capabilities.tool_calling_precision",
)
# Dropped from sys.modules before the module runs, so `import x` has to load them again,
# which the policy refuses.
DROPPED_MODULES = (
    "ctypes", "_ctypes", "subprocess", "_posixsubprocess", "socket", "_socket", "ssl",
    "_ssl", "multiprocessing", "asyncio", "urllib.request", "http.client", "pty", "shutil",
)

def _policy_tables() -> tuple[frozenset, tuple, frozenset, frozenset]:
    """The policy's tables, built fresh for the hook's closure (no module-level copy)."""
    blocked = frozenset({
        "os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
        "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn",
        "resource.setrlimit", "resource.prlimit", "sys.addaudithook", "os.startfile",
        "webbrowser.open", "mmap.__new__", "os.setuid", "os.setgid", "os.chroot",
        "sys.settrace", "sys.setprofile", "gc.get_referrers", "gc.get_referents",
        "gc.get_objects", "sys._current_frames",
    })
    prefixes = ("socket.", "ctypes.", "_ctypes.", "winreg.", "ftplib.", "smtplib.")
    # Events whose first argument is a path: allowed inside the sandbox folders only.
    path_events = frozenset({
        "open", "os.listdir", "os.scandir", "os.remove", "os.rmdir", "os.mkdir", "os.rename",
        "os.chmod", "os.chown", "os.link", "os.symlink", "os.truncate", "os.utime",
        "os.chdir", "os.chflags", "os.setxattr", "os.removexattr", "os.listxattr",
        "os.getxattr", "glob.glob", "shutil.rmtree", "shutil.copyfile", "shutil.move",
        "os.walk", "os.fwalk",
    })
    two_path = frozenset({"os.rename", "os.link", "os.symlink", "shutil.copyfile",
                          "shutil.move"})
    return blocked, prefixes, path_events, two_path


CLONE_NEWNET = 0x40000000
NOBODY = 65534


class SandboxViolation(PermissionError):
    """Raised inside the worker when the module tries something the policy forbids."""


def _format_exception(exc: BaseException, limit: int = 8) -> str:
    frames = traceback.StackSummary.extract(
        traceback.walk_tb(exc.__traceback__), limit=None, lookup_lines=False
    )
    lines = [f'  File "{f.filename}", line {f.lineno}, in {f.name}' for f in frames][-limit:]
    head = f"{type(exc).__name__}: {exc}"
    return "\n".join(["Traceback (most recent call last):", *lines, head]) if lines else head


class Worker:
    def __init__(self, config: dict) -> None:
        self.workdir = os.path.realpath(config["workdir"])
        self.module_path = os.path.join(config.get("module_dir", config["workdir"]),
                                        "env_module.py")
        self.bwrap = config.get("mode") == "bwrap"
        self.config = config
        self.layers: list[str] = []
        self.proto = None
        self.env = None
        self.module_globals: dict = {}

    # -------------------------------------------------------------- confinement
    def preimport(self) -> None:
        import importlib

        for name in (*ALLOWED_STDLIB, *ALLOWED_LIBRARY):
            try:
                importlib.import_module(name)
            except ImportError:
                # A library module that does not exist yet (a domain being written) is
                # simply not available to environment modules.
                continue
        self.warm_up()
        import warnings

        # warnings.showwarning reads source lines through linecache: outside the sandbox.
        warnings.simplefilter("ignore")

    @staticmethod
    def warm_up() -> None:
        """Play one reference episode of every built-in: pydantic and the domains import
        some modules lazily, on first use, which must happen before the policy is on."""
        try:
            from trace_lib.envs.capabilities import builtin_pairs, make_capability_env
        except ImportError:
            return
        for domain, capability in builtin_pairs():
            env = make_capability_env(domain, capability)
            env.reset(0)
            while not env.done:
                env.step(env.reference_action())
            json.dumps(env.summary())
            json.dumps(env.tool_schemas)

    def enter_network_namespace(self) -> None:
        if self.bwrap:
            # bwrap made every namespace before this process started.
            self.layers += ["kernel-namespaces(user,mount,pid,ipc,uts,net)",
                            "read-only-root", "tmpfs-workdir-quota"]
            return
        self.layers.append("UNSAFE-no-kernel-boundary")
        if os.geteuid() != 0 or not self.config.get("isolate_network", True):
            return
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNET) == 0:
            self.layers.append("network-namespace")

    def set_limits(self) -> None:
        import resource

        cpu_used = resource.getrusage(resource.RUSAGE_SELF)
        used = int(cpu_used.ru_utime + cpu_used.ru_stime) + 1
        cpu = used + int(self.config["cpu_s"])
        mem = int(self.config["memory_mb"]) * 1024 * 1024
        fsize = int(self.config["file_mb"]) * 1024 * 1024
        limits = {
            resource.RLIMIT_CPU: (cpu, cpu + 1),
            resource.RLIMIT_AS: (mem, mem),
            resource.RLIMIT_FSIZE: (fsize, fsize),
            resource.RLIMIT_CORE: (0, 0),
            resource.RLIMIT_NOFILE: (64, 64),
        }
        for which, value in limits.items():
            resource.setrlimit(which, value)
        self.layers.append("rlimits")

    def drop_privileges(self) -> None:
        import resource

        if self.bwrap:
            self.layers.append("uid-nobody(user-namespace)")
        elif os.geteuid() == 0:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            self.layers.append("uid-nobody")
        # After the uid change: root is exempt from RLIMIT_NPROC, nobody is not.
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
        self.layers.append("no-child-processes")

    def drop_modules(self) -> None:
        for name in DROPPED_MODULES:
            sys.modules.pop(name, None)

    def install_policy(self) -> None:
        if not self.config.get("audit_policy", True):
            return  # tests of the kernel layer only (the host refuses this without bwrap)
        # Everything the hook uses is bound here, in its closure: nothing on `self` or in
        # module globals that the sandboxed module could reach and change.
        allowed = frozenset(sys.modules)
        blocked, prefixes, path_events, two_path = _policy_tables()
        workdir = os.path.realpath(self.workdir)
        module_dir = os.path.realpath(os.path.dirname(self.module_path))
        writes = (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        proto_write, proto_flush = self.proto.write, self.proto.flush
        dumps, realpath, join = json.dumps, os.path.realpath, os.path.join
        fsdecode, fspath, sep = os.fsdecode, os.fspath, os.sep
        violation = SandboxViolation

        def inside(path: object, reading: bool) -> bool:
            if isinstance(path, int):
                return True  # an already-open descriptor: the sandbox can only hold its own
            if isinstance(path, bytes):
                path = fsdecode(path)
            if not isinstance(path, str):
                path = fspath(path)  # type: ignore[arg-type]
            full = realpath(join(workdir, path))
            # The module's own folder is readable; only the workdir is writable.
            roots = (workdir, module_dir) if reading else (workdir,)
            return any(full == r or full.startswith(r + sep) for r in roots)

        def report(event: str, detail: str) -> None:
            msg = {"violation": {"event": event, "detail": detail[:300]}}
            try:
                proto_write(dumps(msg) + "\n")
                proto_flush()
            except Exception:
                pass
            raise violation(f"sandbox policy: {event} is not allowed ({detail[:200]})")

        def hook(event: str, args: tuple) -> None:
            if event in blocked or event.startswith(prefixes):
                report(event, repr(args)[:300])
            elif event == "import":
                name = args[0]
                if name not in allowed:
                    report(event, f"module {name!r} is not on the sandbox whitelist")
            elif event in path_events and args:
                paths = args[:2] if event in two_path else args[:1]
                if event == "open":
                    mode, flags = (args + (None, 0))[1:3]
                    reading = not (any(c in str(mode or "") for c in "wax+")
                                   or int(flags or 0) & writes)
                else:
                    reading = event in ("os.listdir", "os.scandir", "glob.glob", "os.walk",
                                        "os.fwalk", "os.listxattr", "os.getxattr", "os.chdir")
                for p in paths:
                    if p is not None and not inside(p, reading):
                        report(event, f"path {p!r} is outside the sandbox directory")

        sys.addaudithook(hook)
        self.layers.append("audit-policy")

    def confine(self) -> None:
        self.preimport()
        # Protocol stream: a private copy of stdout; fd 1 becomes stderr.
        self.proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self.enter_network_namespace()
        self.set_limits()
        self.drop_privileges()
        os.chdir(self.workdir)
        self.drop_modules()
        self.install_policy()

    # --------------------------------------------------------------- protocol
    def send(self, obj: dict) -> None:
        self.proto.write(json.dumps(obj, default=str) + "\n")
        self.proto.flush()

    def load(self) -> dict:
        path = self.module_path
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
        code = compile(source, path, "exec")
        self.module_globals = {"__name__": "generated_env", "__file__": path}
        exec(code, self.module_globals)
        factory = self.module_globals.get("make_env")
        if not callable(factory):
            raise TypeError("the module must define make_env() -> Environment")
        self.env = factory()
        env = self.env
        return {"layers": self.layers, "name": env.name, "capability": env.capability,
                "domain": env.domain, "version": env.version}

    def describe(self) -> dict:
        env = self.env
        return {
            "name": env.name,
            "capability": env.capability,
            "domain": env.domain,
            "version": env.version,
            "system_prompt": env.system_prompt,
            "tool_schemas": env.tool_schemas,
            "messages": env.messages,
            "hint": env.hint,
            "done": env.done,
        }

    def handle(self, req: dict) -> object:
        op = req.get("op")
        if op == "load":
            return self.load()
        if self.env is None:
            raise RuntimeError("no environment loaded")
        if op == "reset":
            self.env.reset(int(req["seed"]))
            return self.describe()
        if op == "describe":
            return self.describe()
        if op == "step":
            obs = self.env.step(req["action"])
            return {"observation": obs, "done": self.env.done}
        if op == "summary":
            return self.env.summary()
        if op == "ground_truth":
            return getattr(self.env, "ground_truth", None)
        if op == "reference_action":
            fn = getattr(self.env, "reference_action", None)
            if fn is None:
                raise AttributeError("the environment has no reference_action()")
            return fn()
        raise ValueError(f"unknown op {op!r}")

    def serve(self) -> None:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                req = json.loads(line)
            except json.JSONDecodeError as exc:
                self.send({"ok": False, "kind": "protocol", "error": f"bad request: {exc}"})
                continue
            if req.get("op") == "exit":
                break
            try:
                result = self.handle(req)
                text = json.dumps({"ok": True, "result": result})
            except SandboxViolation as exc:
                text = json.dumps({"ok": False, "kind": "violation", "error": str(exc)})
            except MemoryError:
                text = json.dumps(
                    {"ok": False, "kind": "memory", "error": "MemoryError: memory limit reached"}
                )
            except RecursionError as exc:
                text = json.dumps({"ok": False, "kind": "error", "error": f"RecursionError: {exc}"})
            except BaseException as exc:  # noqa: BLE001 - everything is reported, nothing escapes
                if isinstance(exc, KeyboardInterrupt):
                    raise
                kind = "exit" if isinstance(exc, SystemExit) else "error"
                text = json.dumps({"ok": False, "kind": kind, "error": _format_exception(exc)})
            self.proto.write(text + "\n")
            self.proto.flush()


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("mode") == "bwrap":
        # `python -I -S`: no script folder, no site; the library and the bound packages only.
        sys.path[:0] = [config["library_root"], config["site_packages"]]
    else:
        # sys.path[0] is this file's folder; the library root replaces it so that sibling
        # modules cannot shadow anything.
        sys.path[0] = config["library_root"]
    worker = Worker(config)
    worker.confine()
    worker.serve()


if __name__ == "__main__":
    main()
