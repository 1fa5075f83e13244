"""Routing page (Streamlit AppTest) over a real composed tiny model and a real store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "6_Routing.py")


def _adapter(base_dir: Path, out: Path, seed: int, capability: str) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    peft_model.save_pretrained(str(out))
    (out / "trace_adapter.json").write_text(json.dumps({"capability": capability}))
    return out


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The page runs a tiny model in-process; one thread avoids spinning on a busy CI box."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def composed_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import load_file, save_file

    from trace_lib.compose.gated import compose
    from trace_lib.train.models import ensure_model_dir

    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # module fixtures run before the autouse one
    root = tmp_path_factory.mktemp("routing_page")
    tiny = ensure_model_dir("tiny")
    specs = [(None, _adapter(tiny, root / cap, i, cap))
             for i, cap in enumerate(["precondition_verification", "tool_calling_precision"])]
    compose(str(tiny), specs, out=root / "moe")
    gates = load_file(str(root / "moe" / "gates.safetensors"))
    g = torch.Generator().manual_seed(0)
    save_file({k: torch.randn(v.shape, generator=g) * 2 for k, v in gates.items()},
              str(root / "moe" / "gates.safetensors"))
    torch.set_num_threads(previous)
    return root / "moe"


@pytest.fixture
def store_with_moe(composed_template: Path, tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    from trace_lib.compose.catalog import register_moe

    db = tmp_path / "t.duckdb"
    monkeypatch.setenv("TRACE_DB", str(db))
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))
    register_moe(db, composed_template)
    return db, composed_template


def test_empty_store_explains_how_to_compose(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRACE_DB", str(tmp_path / "none.duckdb"))
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception
    assert any("No composed model yet" in i.value for i in at.info)


def test_live_prompt_is_routed_escaped_and_indexed(store_with_moe) -> None:
    import duckdb

    db, moe_dir = store_with_moe
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception
    assert at.text_input(key="moe_path").value == str(moe_dir.resolve())
    at.text_area(key="prompt").set_value("<script>alert(1)</script> cancel ABC123")
    at.number_input(key="max_new").set_value(4)
    at.button(key="route_go").click().run()
    assert not at.exception
    htmls = [h.proto.body for h in at.get("html")]
    tokens = next(h for h in htmls if "trace-tokens" in h)
    assert "<script>" not in tokens and "&lt;" in tokens  # trajectory text is escaped
    assert any("precondition_verification" in h for h in htmls)  # the legend
    assert len(at.get("plotly_chart")) >= 4  # heatmap, share by role and turn, entropy
    con = duckdb.connect(str(db), read_only=True)
    n = con.execute("SELECT count(*) FROM routing_traces WHERE source = 'prompt'").fetchone()[0]
    con.close()
    assert n == 1
    # Force expert 2 and re-run beside the routed one.
    at.selectbox(key="force").set_value(2)
    at.button(key="force_go").click().run()
    assert not at.exception
    assert any("Forced: slot 2" in m.value for m in at.markdown)
    # Colour by one layer instead of the majority.
    at.selectbox(key="layer").set_value("layer 1").run()
    assert not at.exception


def test_compose_tab_writes_and_registers(store_with_moe, tmp_path: Path) -> None:
    db, moe_dir = store_with_moe
    meta = json.loads((moe_dir / "moe.json").read_text())
    paths = "\n".join(f"{a['name']}={moe_dir / a['path']}" for a in meta["adapters"])
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    at.text_area(key="compose_extra").set_value(paths)
    at.text_input(key="compose_base").set_value("tiny")
    at.text_input(key="compose_out").set_value(str(tmp_path / "new_moe"))
    at.button(key="compose_go").click().run()
    assert not at.exception
    assert any("gate parameters" in s.value for s in at.success)
    assert (tmp_path / "new_moe" / "gates.safetensors").is_file()
    from trace_lib.compose.catalog import list_moe_models

    assert len(list_moe_models(db)) == 2
